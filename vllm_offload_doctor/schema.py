"""The version of every machine-readable output (check --format json, analyze json/jsonl, report.json).

Raise it only for a change a consumer must adapt to (a key removed or renamed, a meaning changed);
new keys keep it.
"""

from __future__ import annotations

SCHEMA_VERSION = 1
