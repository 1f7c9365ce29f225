"""offload-doctor: the truth about vLLM's --cpu-offload-gb."""

__version__ = "0.1.0"
