#!/usr/bin/env python3
"""Build vllm_offload_doctor/data/stack-messages.json: messages of the libraries under vLLM.

    python scripts/stack_catalogue.py            # fetch the pinned wheels into .stack-cache/, build
    python scripts/stack_catalogue.py --check    # exit 1 if the shipped file is stale

Wheels in PINS are fetched with `pip download --no-deps` into .stack-cache/ (gitignored) and read as
zip members, never imported: the CUDA runtime's `cudaError` enum with its doc comments from
driver_types.h, and the `Error while ...` format strings from safetensors' Rust extension (its
string table). Which entry lends which category is not decided here: rules/maps/stack.toml says.
Output is sorted and carries no timestamp. Never edit the JSON by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_offload_doctor" / "data" / "stack-messages.json"
CACHE = ROOT / ".stack-cache"
FORMAT = "stack-messages/1"
PLATFORM = ("--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11")
# library, pip requirement, wheel file name prefix, member to read
PINS = (
    ("cuda-runtime", "nvidia-cuda-runtime-cu12==12.4.127", "nvidia_cuda_runtime_cu12-12.4.127",
     "nvidia/cuda_runtime/include/driver_types.h"),
    ("safetensors", "safetensors==0.4.5", "safetensors-0.4.5",
     "safetensors/_safetensors_rust.cpython-311-x86_64-linux-gnu.so"),
)

_ENUM = re.compile(r"/\*\*((?:(?!\*/).)*)\*/\s*(cudaError\w+)\s*=\s*(\d+)", re.S)
_RUST = re.compile(rb"Error while [a-z][a-z ]{4,60}[a-z]")


def cuda_errors(header: str) -> list[dict[str, Any]]:
    """Each `cudaErrorX = N` of the cudaError enum with the first sentence of its doc comment."""
    body = header[header.find("enum __device_builtin__ cudaError") :]
    body = body[: body.find("};")]
    out = []
    for doc, name, value in _ENUM.findall(body):
        text = " ".join(line.strip().lstrip("*").strip() for line in doc.splitlines()).strip()
        text = re.sub(r"\\ref\s+\S+\s*\"([^\"]*)\"|\\p\s+|\\ref\s+", r"\1", text)
        first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
        out.append({"name": name, "code": int(value), "template": first})
    return out


def rust_strings(blob: bytes) -> list[dict[str, Any]]:
    """`Error while ...` format strings in an extension's string table; a Debug `{:?}` follows."""
    found = sorted({m.decode() for m in _RUST.findall(blob)})
    return [{"name": s, "template": s + ": {detail}"} for s in found]


def fetch() -> None:
    CACHE.mkdir(exist_ok=True)
    for _, req, prefix, _ in PINS:
        if not any(CACHE.glob(prefix + "*.whl")):
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *PLATFORM, "-d", str(CACHE), req]
            subprocess.run(cmd, check=True)


def build(cache: Path = CACHE) -> dict[str, Any]:
    messages = []
    for library, req, prefix, member in PINS:
        wheel = next(iter(sorted(cache.glob(prefix + "*.whl"))))
        version = req.split("==", 1)[1]
        data = zipfile.ZipFile(wheel).read(member)
        found = cuda_errors(data.decode()) if library == "cuda-runtime" else rust_strings(data)
        messages.extend({"library": library, "package": req.split("==")[0], "versions": [version],
                         "file": member.rsplit("/", 1)[-1], **item} for item in found)
    messages.sort(key=lambda m: (m["library"], m["name"]))
    return {"format": FORMAT, "generated_by": "scripts/stack_catalogue.py",
            "sources": [p[1] for p in PINS], "messages": messages}


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    fetch()
    text = dump(build())
    if args.check:
        return 0 if args.out.read_text(encoding="utf-8") == text else 1
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
