#!/usr/bin/env python3
"""Write the config-only Qwen3 dense model of the device kit's section 6 (81.5 B params, 151.8 GiB bf16).

It does not fit one H200 without offload. Served with `--load-format dummy --enforce-eager`, so no weight files
are needed: the directory holds config.json plus the kit's tokenizer and generation files.
Usage: make_big_model.py [SRC=/tmp/qwen3-0.6b-random] [DST=/tmp/big]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SHAPE = {
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 90,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "max_window_layers": 90,
}


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/qwen3-0.6b-random")
    dst = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/big")
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config.update(SHAPE)
    config.pop("layer_types", None)  # left at 28 entries, transformers rejects the config
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for path in src.iterdir():
        if path.name != "config.json" and path.suffix in (".json", ".txt", ".jinja", ".model"):
            shutil.copy(path, dst / path.name)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
