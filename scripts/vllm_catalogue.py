#!/usr/bin/env python3
"""Build vllm_offload_doctor/data/vllm-messages.json: the messages vLLM's own source raises and logs.

    python scripts/vllm_catalogue.py                            # build: every version in VERSIONS
    python scripts/vllm_catalogue.py build --src-dir DIR        # reuse trees extracted in DIR
    python scripts/vllm_catalogue.py build --check              # exit 1 if the data file is stale
    python scripts/vllm_catalogue.py build --versions 0.32.0 0.33.0 --out /tmp/x.json
    python scripts/vllm_catalogue.py query --grep offload       # read the catalogue, no network
    python scripts/vllm_catalogue.py query --category oom_kv_cache --kind raise --since 0.20.0
    python scripts/vllm_catalogue.py query --grep 'pinned' --format markdown

For each version the released wheel is fetched with `pip download vllm==X --no-deps` (never imported,
never installed), its .py files are unpacked into SRC_DIR/X/ and the wheel is deleted. The modules in
MODULES are read as text and parsed with `ast`; every `raise Cls(msg)`, `assert cond, msg` and
`logger.<level>(msg, *args)` with a readable message becomes a template: literal text with `{name}`
placeholders for f-string fields and %-format arguments (literal braces doubled, as in str.format).
Each (template, kind, type, file) records the first and last version that has it and the line at
the last one. Output is sorted (file, line, template) and carries no timestamp, so the same wheels
give the same bytes. Run it again to refresh the catalogue; never edit the JSON by hand. To add a
release, append it to VERSIONS and run `build` (trees already in --src-dir are not fetched again).

`query` lists catalogued messages (one block per template: each file that has it, with its first and
last release), filtered by regex (`--grep`, case-insensitive, any of several), by a preset of the
verdict categories (`--category`, see CATEGORIES), by kind, and by release range.
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
from typing import Any

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


# Presets for `query --category`: a regex over "Class: template" and one over the file path. They
# are for reading the catalogue while writing rules, deliberately wide; a human picks from the list.
CATEGORIES: dict[str, tuple[str, str]] = {
    "oom_kv_cache": (
        r"KV cache|kv_cache|cache blocks|GPU blocks|num_gpu_blocks|max seq len|"
        r"Maximum concurrency|block_size|KV Cache",
        r"",
    ),
    "oom_weights": (
        r"out of memory|OutOfMemory|not enough (?:GPU )?memory|Model loading took|"
        r"Loading model weights took|weights? took|memory usage",
        r"",
    ),
    "oom_gpu_util": (
        r"gpu_memory_utilization|GPU memory utilization|Free memory on device|memory profiling|"
        r"free memory|requested_memory|memory budget",
        r"",
    ),
    "offload_error": (
        r"offload|Offload|pinn?(?:ed)?[ _]memory|page-locked|\bUVA\b|\buva\b|must be pinned",
        r"",
    ),
    "offload_ignored": (
        r"V2 Model Runner|Model Runner V2|model runner|Offloader set|CPU offloaded|"
        r"Loading model from scratch|Starting to load model|Model loading took",
        r"",
    ),
    "bad_args": (
        r"^(?:ValueError|TypeError|AssertionError|ArgumentTypeError|ArgumentError|"
        r"VLLMValidationError|ValidationError|NotImplementedError): .*(?:must|should|not supported|"
        r"invalid|Invalid|unsupported|Unsupported|cannot|expected|greater|less|exceed)",
        r"^vllm/(?:config|engine/arg_utils|entrypoints/openai/cli_args|entrypoints/cli|config/)",
    ),
    "unsupported_gpu": (
        r"compute capability|sm_\d|SM\d|[Bb]float16|not supported on (?:this|your|the current) "
        r"(?:GPU|device|platform)|Volta|Turing|FlashAttention|no kernel image|GPU .*not supported",
        r"",
    ),
    "distributed": (
        r"NCCL|nccl|Ray|ray cluster|placement group|world_size|world size|rank|"
        r"shared memory|shm|gloo|Gloo|process group|init_process_group|MASTER_|distributed",
        r"",
    ),
    "model_download": (
        r"huggingface|Hugging ?Face|HF_|hf_hub|hub|download|[Rr]epo(?:sitory)?\b|revision|"
        r"snapshot|ModelScope|modelscope|safetensors|config\.json|gated|offline|local files?",
        r"^vllm/(?:transformers_utils|model_executor/model_loader|config|engine/arg_utils)",
    ),
    "tokenizer_template": (
        r"[Tt]okenizer|chat template|chat_template|[Jj]inja|ChatTemplate",
        r"",
    ),
}


@dataclass(slots=True)
class Entry:
    template: str
    kind: str
    type: str
    file: str
    versions: list[str] = field(default_factory=list)
    line: int = 0


# How `fetch` gets the sources, as the generated files say.
SOURCE = "vllm wheels from PyPI (pip download vllm==X --no-deps), read as text"


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
        "source": SOURCE,
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


def build(args: argparse.Namespace) -> int:
    started = time.monotonic()
    cache: dict[str, list[Found]] = {}
    per_version = []
    for version in args.versions:
        try:
            tree = fetch(version, args.src_dir, args.wheel_dir, args.keep_wheels)
        except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile, IndexError) as exc:
            print(f"vllm_catalogue: {version}: skipped ({exc})", file=sys.stderr)
            continue
        per_version.append((version, scan(tree, cache)))
    if not per_version:
        print("vllm_catalogue: no version could be read", file=sys.stderr)
        return 2
    doc = document(merge(per_version), [v for v, _ in per_version])
    text = dump(doc)
    if args.check:
        try:
            current = args.out.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"vllm_catalogue: {args.out}: {exc}", file=sys.stderr)
            return 1
        if current != text:
            old = {json.dumps(m, sort_keys=True) for m in json.loads(current).get("messages", [])}
            new = {json.dumps(m, sort_keys=True) for m in doc["messages"]}  # type: ignore[attr-defined]
            print(
                f"{args.out} is stale: {len(new - old)} entries to add or change, "
                f"{len(old - new)} to remove; run scripts/vllm_catalogue.py build",
                file=sys.stderr,
            )
            return 1
        print(f"{args.out}: up to date ({doc['count']} messages, {len(per_version)} versions)")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    size = args.out.stat().st_size
    print(
        f"{args.out}: {doc['count']} messages from {len(per_version)} versions, "
        f"{size / 1024:.0f} KiB, {time.monotonic() - started:.0f} s"
    )
    return 0


def select(
    messages: Iterable[dict[str, Any]],
    versions: Sequence[str],
    *,
    greps: Sequence[str] = (),
    category: str | None = None,
    kinds: Sequence[str] = (),
    since: str | None = None,
    until: str | None = None,
) -> list[dict[str, Any]]:
    """The catalogue entries a query asks for, in catalogue order."""
    wanted = [re.compile(g, re.IGNORECASE) for g in greps]
    text_re = file_re = None
    if category is not None:
        text_re, file_re = (re.compile(p) if p else None for p in CATEGORIES[category])
    rank = {v: i for i, v in enumerate(versions)}
    low = rank.get(since, -1) if since else -1
    high = rank.get(until, len(versions)) if until else len(versions)
    if since and since not in rank:
        low = sum(Version(v) < Version(since) for v in versions)
    if until and until not in rank:
        high = sum(Version(v) <= Version(until) for v in versions) - 1
    out = []
    for m in messages:
        shown = f"{m['type']}: {m['template']}"
        if wanted and not any(w.search(shown) for w in wanted):
            continue
        if text_re is not None and not text_re.search(shown):
            continue
        if file_re is not None and not file_re.search(m["file"]):
            continue
        if kinds and m["kind"] not in kinds and m["type"] not in kinds:
            continue
        # Overlaps the asked range: last release at or after `since`, first at or before `until`.
        if rank.get(m["last"], -1) < low or rank.get(m["first"], len(versions)) > high:
            continue
        out.append(m)
    return out


def grouped(messages: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Entries by template, each template's entries newest first; templates by newest release,
    then alphabetically."""
    by_template: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        by_template.setdefault(m["template"], []).append(m)
    for entries in by_template.values():
        entries.sort(key=lambda m: (Version(m["last"]), m["file"]), reverse=True)
    groups = sorted(by_template.items())
    groups.sort(key=lambda item: Version(item[1][0]["last"]), reverse=True)  # stable
    return groups


def span(m: dict[str, Any]) -> str:
    text = m["first"] if m["first"] == m["last"] else f"{m['first']}–{m['last']}"
    return text + (f" (not in {', '.join(m['missing'])})" if m.get("missing") else "")


def render(groups: Sequence[tuple[str, list[dict[str, Any]]]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(
            [{"template": t, "entries": entries} for t, entries in groups],
            indent=1,
            ensure_ascii=False,
        )
    lines = []
    for template, entries in groups:
        if fmt == "markdown":
            lines.append(f"- `{template}`".replace("\n", "\\n"))
            lines += [
                f"  - {m['kind']} {m['type']} `{m['file']}:{m['line']}` {span(m)}" for m in entries
            ]
        else:
            lines.append(template.replace("\n", "\\n"))
            lines += [
                f"    {m['kind']} {m['type']}  {m['file']}:{m['line']}  {span(m)}" for m in entries
            ]
    return "\n".join(lines)


def query(args: argparse.Namespace) -> int:
    doc = json.loads(args.data.read_text(encoding="utf-8"))
    found = select(
        doc["messages"],
        doc["versions"],
        greps=args.grep,
        category=args.category,
        kinds=args.kind,
        since=args.since,
        until=args.until,
    )
    groups = grouped(found)
    if groups:
        print(render(groups, args.format))
    print(
        f"{len(groups)} messages ({len(found)} entries) of {doc['count']} in {args.data.name}, "
        f"releases {doc['versions'][0]}–{doc['versions'][-1]}",
        file=sys.stderr,
    )
    return 0 if groups else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("build", "query", "-h", "--help"):
        argv.insert(0, "build")  # `vllm_catalogue.py --versions ...` still builds
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download and read the wheels, write the catalogue")
    b.add_argument("--versions", nargs="+", default=list(VERSIONS))
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    b.add_argument("--src-dir", type=Path, default=cache_root / "vllm-src")
    b.add_argument("--wheel-dir", type=Path, default=cache_root / "vllm-wheels")
    b.add_argument("--keep-wheels", action="store_true")
    b.add_argument("--out", type=Path, default=OUT)
    b.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    q = sub.add_parser("query", help="list catalogued messages with their files and releases")
    q.add_argument("--data", type=Path, default=OUT)
    q.add_argument("--grep", action="append", default=[], help="regex, case-insensitive")
    q.add_argument("--category", choices=sorted(CATEGORIES))
    q.add_argument("--kind", action="append", default=[], help="raise, log, or a class/method")
    q.add_argument("--since", help="only messages still present at or after this release")
    q.add_argument("--until", help="only messages present at or before this release")
    q.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    args = parser.parse_args(argv)
    return build(args) if args.command == "build" else query(args)


if __name__ == "__main__":
    sys.exit(main())
