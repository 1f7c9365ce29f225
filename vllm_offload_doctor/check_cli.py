"""`offload-doctor check` command (being built)."""

from __future__ import annotations

import click

from vllm_offload_doctor.errors import DoctorError


@click.command("check")
def check() -> None:
    """Not available yet."""
    raise DoctorError("check is not available in this build")
