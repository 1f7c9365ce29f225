"""`offload-doctor compare` command (being built)."""

from __future__ import annotations

import click

from vllm_offload_doctor.errors import DoctorError


@click.command("compare")
def compare() -> None:
    """Not available yet."""
    raise DoctorError("compare is not available in this build")
