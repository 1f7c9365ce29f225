"""The lines a prefilter find reports, for the tests that hold one find to another."""

from __future__ import annotations


def found_lines(find: object, data: bytes) -> list[int]:
    """The offsets of the lines a find reports, resuming after each (as engine._scan does)."""
    out, pos = [], 0
    while (span := find(data, pos)) is not None:  # type: ignore[operator]
        out.append(data.rfind(b"\n", pos, span[0]) + 1 or pos)
        end = data.find(b"\n", span[1])
        if end < 0:
            break
        pos = end + 1
    return out
