"""Exceptions the CLI turns into one-line errors with distinct exit codes."""

from __future__ import annotations


class DoctorError(Exception):
    """A failure the user can act on; shown as one line, exit 2."""

    exit_code = 2


class InputError(DoctorError):
    """A log file or other input could not be read."""


class RuleFileError(DoctorError):
    """A rule file is invalid; the message names the file and the key."""


class ProbeError(DoctorError):
    """A machine probe could not run at all (not the same as a failed check)."""


class ServerStartError(DoctorError):
    """`vllm serve` could not be started or did not become ready."""


class PortInUseError(DoctorError):
    """The port a server should bind is already taken."""
