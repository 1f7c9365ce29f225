"""Where the labelled corpus is: ../shared/corpus beside the checkout, or $OFFLOAD_DOCTOR_CORPUS.

Tests that need it skip with NOT_FOUND as their reason (an unpacked sdist has no ../shared).
"""

from __future__ import annotations

import os
from pathlib import Path

CORPUS = Path(
    os.environ.get("OFFLOAD_DOCTOR_CORPUS")
    or Path(__file__).resolve().parents[3] / "shared" / "corpus"
)
NOT_FOUND = f"labelled corpus not found at {CORPUS} (set OFFLOAD_DOCTOR_CORPUS)"
