"""Every normalisation pattern is linear in the line (issue 20 item 4).

The crafted lines below took main minutes per 256 KiB line (`[` + `a.` x n in the outer-prefix
pattern, Ray's `repeated` suffix and the box frame after a run of blanks, `</b ` repeated in the
HTML strip). Each runs in a subprocess under a limit far above a linear time and far below the
quadratic one, so a regression fails rather than hangs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from vllm_offload_doctor.analyze import normalize

N = 256 << 10
LIMIT_S = 20  # linear: well under 1 s on a busy machine; main: over 30 s for each line
# Python expressions of the lines (built in the subprocess that times them).
CRAFTED = {
    "bracket + a.": '"[" + "a." * (N // 2) + " ERROR"',
    "ERROR + bracket + a.": '"ERROR [" + "a." * (N // 2)',
    "repeated + spaces": '"(Worker pid=1) repeated" + " " * N + "x"',
    "</b repeated": '"ERROR " + "</b " * N',  # 1 MiB: main's 6 s at 256 KiB grow 16x
    "box + spaces": '"│" + " " * N + "x"',
    "box + spaces + box": '"│ ERROR" + " " * N + "x │"',
    "pid-looking paren + spaces": '"x (" + "a " * (N // 2) + "pid=1"',
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_line_normalises_in_linear_time(name: str) -> None:
    code = (
        "import sys, time\n"
        "from vllm_offload_doctor.analyze import normalize\n"
        f"N = {N}\nline = {CRAFTED[name]}\n"
        "start = time.perf_counter()\n"
        "for part in normalize.split_long(line):\n    normalize.parse(1, part)\n"
        "print(time.perf_counter() - start)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: over {LIMIT_S} s for one 256 KiB line (a quadratic pattern)")
    assert float(proc.stdout.split()[-1]) < LIMIT_S


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        ("│ INFO 11-29 15:14:20 [api_server.py:1] ready │", "ready"),
        ("┃INFO 11-29 15:14:20 [api_server.py:1] ready   ┃  ", "ready"),
        ("| INFO 11-29 15:14:20 [api_server.py:1] ready", "ready"),
        (
            "(Worker pid=3) INFO 11-29 15:14:20 [w.py:1] loaded [repeated 3x across cluster]",
            "loaded",
        ),
        (
            "(Worker pid=3) INFO 11-29 15:14:20 [w.py:1] loaded [repeated 3x across cluster]  ",
            "loaded",
        ),
        (
            "INFO 11-29 15:14:20 [w.py:1] a [repeated 3x across cluster] b",
            "a [repeated 3x across cluster] b",
        ),
        ("[job: 1] INFO 11-29 15:14:20 [w.py:1] ok", "ok"),
        ("[ray.worker.x: gpu] INFO 11-29 15:14:20 [w.py:1] ok", "ok"),
        ("<b>ERROR</b> 11-29 15:14:20 [w.py:1] <font color='red'>bad</font>", "bad"),
    ],
)
def test_linear_rewrites_keep_what_the_patterns_did(raw: str, msg: str) -> None:
    assert normalize.parse(1, raw).msg == msg
