#!/usr/bin/env python3
"""Write vllm_offload_doctor/data/vllm-lending.json: the catalogue's raise messages that lend a
category (analyze/raises.py), derived once here instead of in every process.

Run after regenerating data/vllm-messages.json or editing rules/maps/frames.toml; a test fails
while the shipped file is stale, and the doctor derives the set itself until it is rewritten.
Usage: python scripts/build_lending.py
"""

from __future__ import annotations

import json

from vllm_offload_doctor.analyze import raises


def main() -> None:
    doc = raises.dump(raises.derive_builtin())
    path = raises.cache_path()
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{path}: {len(doc['kept'])} lending templates")


if __name__ == "__main__":
    main()
