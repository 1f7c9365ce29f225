#!/usr/bin/env python3
"""Build vllm_offload_doctor/data/vllm-messages.json: the messages vLLM's own source raises and logs.

    python scripts/vllm_catalogue.py                          # every version in VERSIONS
    python scripts/vllm_catalogue.py --src-dir /work/vllm-src # reuse trees extracted there
    python scripts/vllm_catalogue.py --versions 0.32.0 0.33.0 --out /tmp/x.json

For each version the released wheel is fetched with `pip download vllm==X --no-deps` (never imported,
never installed), its .py files are unpacked into SRC_DIR/X/ and the wheel is deleted. The modules in
MODULES are read as text and parsed with `ast`; every `raise Cls(msg)`, `assert cond, msg` and
`logger.<level>(msg, *args)` with a readable message becomes a template: literal text with `{name}`
placeholders for f-string fields and %-format arguments (literal braces doubled, as in str.format).
Each (template, kind, type, file) records the first and last version that has it and the line at
the last one. Run it again to refresh the catalogue; never edit the JSON by hand.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from message_templates import Found, extract
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_offload_doctor" / "data" / "vllm-messages.json"
FORMAT = "vllm-messages/1"

# Every release on PyPI from 0.4.0 (the oldest era in the corpus) to 0.33.0.
# fmt: off
VERSIONS = (
    "0.4.0", "0.4.0.post1", "0.4.1", "0.4.2", "0.4.3", "0.5.0", "0.5.0.post1", "0.5.1", "0.5.2",
    "0.5.3", "0.5.3.post1", "0.5.4", "0.5.5", "0.6.0", "0.6.1", "0.6.1.post1", "0.6.1.post2", "0.6.2",
    "0.6.3", "0.6.3.post1", "0.6.4", "0.6.4.post1", "0.6.5", "0.6.6", "0.6.6.post1", "0.7.0", "0.7.1",
    "0.7.2", "0.7.3", "0.8.0", "0.8.1", "0.8.2", "0.8.3", "0.8.4", "0.8.5", "0.8.5.post1",
    "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.1.1", "0.10.2", "0.11.0",
    "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0",
    "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2",
    "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0",
    "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
)
# fmt: on

# The modules whose messages reach a serving log at start-up or when the engine dies: engine,
# executor and workers (V1 and the V2 runner), model loading and the offloader, config and CLI
# arguments, distributed init and NCCL, CUDA/ROCm platforms, server entrypoints, KV-cache sizing and
# KV offload set-up, tokenizers, chat templates and hub/config resolution. Left out: request-time
# serving code, model definitions, kernels, quantization methods, KV-transfer connectors.
# `*` stays inside one folder, `**` spans folders.
MODULES = (
    "vllm/engine/*.py",
    "vllm/v1/engine/*.py",
    "vllm/executor/*.py",
    "vllm/v1/executor/*.py",
    "vllm/worker/*.py",
    "vllm/v1/worker/*.py",
    "vllm/v1/worker/gpu/*.py",
    "vllm/model_executor/model_loader/*.py",
    "vllm/model_executor/offloader/*.py",
    "vllm/model_executor/models/utils.py",
    "vllm/config.py",
    "vllm/config/*.py",
    "vllm/distributed/*.py",
    "vllm/distributed/device_communicators/*.py",
    "vllm/distributed/kv_transfer/kv_connector/factory.py",
    "vllm/v1/kv_offload/*.py",
    "vllm/platforms/__init__.py",
    "vllm/platforms/interface.py",
    "vllm/platforms/cuda.py",
    "vllm/platforms/rocm.py",
    "vllm/entrypoints/*.py",
    "vllm/entrypoints/cli/**.py",
    "vllm/entrypoints/openai/api_server.py",
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/entrypoints/launchers/*.py",
    "vllm/v1/core/*.py",
    "vllm/core/*.py",
    "vllm/utils.py",
    "vllm/utils/*.py",
    "vllm/transformers_utils/*.py",
    "vllm/transformers_utils/tokenizers/*.py",
    "vllm/tokenizers/*.py",
    "vllm/renderers/*.py",
    "vllm/renderers/chat_utils/*.py",
    "vllm/device_allocator/*.py",
)


@dataclass(slots=True)
class Entry:
    template: str
    kind: str
    type: str
    file: str
    versions: list[str] = field(default_factory=list)
    line: int = 0


@functools.cache
def _glob(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*|\*)", pattern)
    body = "".join({"**": ".*", "*": "[^/]*"}.get(p, re.escape(p)) for p in parts)
    return re.compile(body + r"\Z")


def selected(relpath: str, modules: Sequence[str] = MODULES) -> bool:
    """Whether a path inside the wheel is one of the modules that matter."""
    return any(_glob(m).match(relpath) for m in modules)


def fetch(version: str, src_dir: Path, wheel_dir: Path, keep_wheel: bool = False) -> Path:
    """SRC_DIR/VERSION holding the wheel's .py files, downloading the wheel when not there yet."""
    tree = src_dir / version
    if (tree / "vllm").is_dir():
        return tree
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(wheel_dir.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        base = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps"]
        base += ["--only-binary=:all:", "-q", "-d", str(wheel_dir)]
        # Old releases ship per-CPython wheels only: ask for 3.11's when this Python has none.
        tags = ["--python-version", "3.11", "--platform", "manylinux1_x86_64"]
        tags += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_31_x86_64"]
        if subprocess.run(base, check=False).returncode != 0:
            subprocess.run(base + tags, check=True)
        wheels = sorted(wheel_dir.glob(f"vllm-{version}-*.whl"))
    partial = src_dir / f"{version}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheels[0]) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith(".py") and not name.startswith("/") and ".." not in name.split("/"):
                zf.extract(info, partial)
    partial.rename(tree)
    if not keep_wheel:
        wheels[0].unlink()
    return tree


def scan(tree: Path, cache: dict[str, list[Found]]) -> dict[str, list[Found]]:
    """Messages per selected file of one extracted version (files seen before come from `cache`)."""
    out: dict[str, list[Found]] = {}
    for path in sorted(tree.rglob("*.py")):
        rel = path.relative_to(tree).as_posix()
        if not selected(rel):
            continue
        data = path.read_bytes()
        digest = hashlib.sha1(data).hexdigest()
        if digest not in cache:
            cache[digest] = extract(data.decode("utf-8", "replace"))
        out[rel] = cache[digest]
    return out


def merge(per_version: Iterable[tuple[str, dict[str, list[Found]]]]) -> list[Entry]:
    """One entry per (template, kind, type, file) with the versions that have it, oldest first."""
    entries: dict[tuple[str, str, str, str], Entry] = {}
    for version, files in sorted(per_version, key=lambda item: Version(item[0])):
        for rel, found in files.items():
            for f in found:
                key = (f.template, f.kind, f.type, rel)
                entry = entries.setdefault(key, Entry(f.template, f.kind, f.type, rel))
                if not entry.versions or entry.versions[-1] != version:
                    entry.versions.append(version)
                entry.line = f.line
    return sorted(entries.values(), key=lambda e: (e.file, e.line, e.template, e.kind, e.type))


def document(entries: Sequence[Entry], versions: Sequence[str]) -> dict[str, object]:
    ordered = sorted(versions, key=Version)
    messages = []
    for e in entries:
        item: dict[str, object] = {
            "template": e.template,
            "kind": e.kind,
            "type": e.type,
            "file": e.file,
            "line": e.line,
            "first": e.versions[0],
            "last": e.versions[-1],
        }
        span = ordered[ordered.index(e.versions[0]) : ordered.index(e.versions[-1]) + 1]
        missing = [v for v in span if v not in set(e.versions)]
        if missing:
            item["missing"] = missing
        messages.append(item)
    return {
        "format": FORMAT,
        "generated_by": "scripts/vllm_catalogue.py",
        "source": "vllm wheels from PyPI (pip download vllm==X --no-deps), read as text",
        "versions": ordered,
        "modules": list(MODULES),
        "line": "line of the raise/assert/logger call at the last version",
        "count": len(messages),
        "messages": messages,
    }


def dump(doc: dict[str, object]) -> str:
    """JSON with one message per line, so a regenerated catalogue diffs readably."""
    head = {k: v for k, v in doc.items() if k != "messages"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": [']
    rows = [json.dumps(m, ensure_ascii=False) for m in doc["messages"]]  # type: ignore[attr-defined]
    lines.append(",\n".join(rows))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    parser.add_argument("--src-dir", type=Path, default=cache_root / "vllm-src")
    parser.add_argument("--wheel-dir", type=Path, default=cache_root / "vllm-wheels")
    parser.add_argument("--keep-wheels", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    started = time.monotonic()
    cache: dict[str, list[Found]] = {}
    per_version = []
    for version in args.versions:
        try:
            tree = fetch(version, args.src_dir, args.wheel_dir, args.keep_wheels)
        except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile) as exc:
            print(f"vllm_catalogue: {version}: skipped ({exc})", file=sys.stderr)
            continue
        per_version.append((version, scan(tree, cache)))
    if not per_version:
        print("vllm_catalogue: no version could be read", file=sys.stderr)
        return 2
    doc = document(merge(per_version), [v for v, _ in per_version])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(doc), encoding="utf-8")
    size = args.out.stat().st_size
    print(
        f"{args.out}: {doc['count']} messages from {len(per_version)} versions, "
        f"{size / 1024:.0f} KiB, {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
