"""The `compare` click command (it lives in `vllm_offload_doctor.compare.cli`)."""

from vllm_offload_doctor.compare.cli import compare
from vllm_offload_doctor.compare.config import DEFAULT_MODEL

__all__ = ["DEFAULT_MODEL", "compare"]
