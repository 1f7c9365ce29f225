"""Exceptions the CLI turns into one-line errors with distinct exit codes.

`kind` names the failure in the JSON error object (`cli.main` prints it in JSON mode), so a
script can tell a bad input from a dead server without parsing the message.
"""

from __future__ import annotations

from vllm_offload_doctor import exitcodes


class DoctorError(Exception):
    """A failure the user can act on; shown as one line, exit 2."""

    exit_code = exitcodes.USAGE
    kind = "error"


class InputError(DoctorError):
    """A log file or other input could not be read."""

    kind = "input"


class RuleFileError(DoctorError):
    """A rule file is invalid; the message names the file and the key."""

    kind = "rule_file"


class ProbeError(DoctorError):
    """A machine probe could not run at all (not the same as a failed check)."""

    kind = "probe"


class ServerStartError(DoctorError):
    """`vllm serve` could not be started or did not become ready."""

    kind = "server_start"


class PortInUseError(DoctorError):
    """The port a server should bind is already taken."""

    kind = "port_in_use"


class OutputError(DoctorError):
    """The report could not be written where -o/--output asks."""

    kind = "output"


class Interrupted(DoctorError):
    """Ctrl+C (SIGINT) or a signal (SIGTERM, SIGHUP, SIGQUIT) stopped the command; the message
    says what was left behind. A signal exits 128 + its number (143, 129, 131), as shells do."""

    exit_code = exitcodes.INTERRUPTED
    kind = "interrupted"

    def __init__(self, message: str, *, signum: int | None = None) -> None:
        super().__init__(message)
        if signum is not None:
            self.exit_code = 128 + signum
            self.kind = "terminated"
