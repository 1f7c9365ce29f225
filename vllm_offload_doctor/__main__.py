"""The console script and `python -m vllm_offload_doctor`: `--version` answers before click and the
commands are imported (a bare interpreter's start-up, not the CLI's); everything else goes to
`cli.main`."""

from __future__ import annotations

import sys

from vllm_offload_doctor import __version__

VERSION_LINE = f"offload-doctor, version {__version__}"  # what click's version_option prints


def main() -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):
        sys.stdout.write(VERSION_LINE + "\n")
        return
    if sys.argv[1:2] == ["check"] and not {"-h", "--help", "--list"} & set(sys.argv[2:]):
        # check waits longest on the NVIDIA driver's start-up: begin it while the CLI imports.
        from vllm_offload_doctor.machine.early import start_nvml

        start_nvml()
    import atexit
    import gc

    # The process is ending: leave what the command allocated to it rather than to the collector's
    # passes over every object at shutdown (20-30 ms, a sixth of `check`). atexit runs before them.
    atexit.register(gc.freeze)
    from vllm_offload_doctor.cli import main as run

    run()


if __name__ == "__main__":
    main()
