"""`offload-doctor analyze` and `offload-doctor rules` commands (being built)."""

from __future__ import annotations

import click

from vllm_offload_doctor.errors import DoctorError


@click.command("analyze")
def analyze() -> None:
    """Not available yet."""
    raise DoctorError("analyze is not available in this build")


@click.command("rules")
def rules() -> None:
    """Not available yet."""
    raise DoctorError("rules is not available in this build")
