"""Every web link the code prints, and every one that rule files share, in one place.

A moved page is fixed here once; tests/cli/test_links.py keeps rule files spelling shared links as here
and code from writing them out again.
"""

from __future__ import annotations

ISSUE_MRV2 = "https://github.com/vllm-project/vllm/issues/51396"
PR_MRV2_FIX = "https://github.com/vllm-project/vllm/pull/51413"
ISSUE_HOST_RAM = "https://github.com/vllm-project/vllm/issues/56410"
ISSUE_FITS_ANYWAY = "https://github.com/vllm-project/vllm/issues/57771"
ISSUE_OFFLOAD_FEATURES = "https://github.com/vllm-project/vllm/issues/11748"
ISSUES = "https://github.com/vllm-project/vllm/issues"
DOCS_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
DOCS_GPU = "https://docs.vllm.ai/en/latest/getting_started/installation/gpu/"
DOCS_SERVE = "https://docs.vllm.ai/en/latest/cli/serve/"
DOCS_WSL = "https://learn.microsoft.com/windows/wsl/install"
# Where a bug of the doctor itself is reported (pyproject's [project.urls] Issues says the same).
DOCTOR_ISSUES = "https://github.com/vllm-offload-doctor/vllm-offload-doctor/issues"

# The Model Runner V2 offload bug and its fix: what analyze, compare and check all cite.
MRV2 = (ISSUE_MRV2, PR_MRV2_FIX)
