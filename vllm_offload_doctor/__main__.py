"""`python -m vllm_offload_doctor` entry point."""

from vllm_offload_doctor.cli import main

main()
