"""NVML read from the moment the process starts, for `check`: the driver's start-up is its
longest wait, and it releases the GIL, so it runs while the command line is parsed and the CLI
imported. This module imports nothing else at first, so the read begins at once.
"""

from __future__ import annotations

import threading

TYPE_CHECKING = False  # typing itself is no light import
if TYPE_CHECKING:
    from typing import Any

    from vllm_offload_doctor.machine.probes import NvmlInfo

# Reads begun by `start_nvml`, each with the box its answer (or exception) lands in.
_BEGUN: list[tuple[threading.Thread, list[Any]]] = []


def start_nvml() -> None:
    """Begin `probes.read_nvml` in a thread now, for the next `take_nvml` (`RealProbe.nvml()`)."""
    box: list[Any] = []
    thread = threading.Thread(target=_read, args=(box,), name="nvml", daemon=True)
    thread.start()
    _BEGUN.append((thread, box))


def take_nvml() -> NvmlInfo | None:
    """The answer of a read `start_nvml` began (waiting for it); None when none was begun.

    An exception of the read is raised here, as if the caller had called read_nvml.
    """
    try:
        thread, box = _BEGUN.pop()
    except IndexError:
        return None
    thread.join()
    if isinstance(box[0], Exception):
        raise box[0]
    return box[0]  # type: ignore[no-any-return]


def _read(box: list[Any]) -> None:
    warm = _init()
    try:
        from vllm_offload_doctor.machine.probes import read_nvml

        box.append(read_nvml())
    except Exception as exc:
        box.append(exc)
    finally:
        if warm is not None:
            import contextlib

            with contextlib.suppress(Exception):  # read_nvml has its answer
                warm.nvmlShutdown()


def _init() -> Any:
    """nvmlInit before the probes module is even imported; read_nvml's own nvmlInit then finds
    the driver up (NVML counts its inits: the last nvmlShutdown ends it). None if it failed:
    read_nvml meets the same failure and says what it was."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml
