"""Every web link the doctor prints, in one place, so that a moved page is fixed once."""

from __future__ import annotations

ISSUE_MRV2 = "https://github.com/vllm-project/vllm/issues/51396"
PR_MRV2_FIX = "https://github.com/vllm-project/vllm/pull/51413"
ISSUE_HOST_RAM = "https://github.com/vllm-project/vllm/issues/56410"
ISSUE_FITS_ANYWAY = "https://github.com/vllm-project/vllm/issues/57771"
DOCS_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
DOCS_GPU = "https://docs.vllm.ai/en/latest/getting_started/installation/gpu.html"
DOCS_WSL = "https://learn.microsoft.com/windows/wsl/install"

# The Model Runner V2 offload bug and its fix: what analyze, compare and check all cite.
MRV2 = (ISSUE_MRV2, PR_MRV2_FIX)
