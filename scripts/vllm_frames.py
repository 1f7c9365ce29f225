#!/usr/bin/env python3
"""Build vllm_offload_doctor/data/vllm-frames.json: the functions of vLLM's single-purpose subsystems.

    python scripts/vllm_frames.py                      # every version of vllm_catalogue.VERSIONS
    python scripts/vllm_frames.py --check              # exit 1 if the shipped file is stale
    python scripts/vllm_frames.py --src-dir DIR        # trees extracted there (default .vllm-src/)

rules/maps/subsystems.toml, kept by hand, names the subsystems (module globs), the category a
failure inside each implies and how its functions are selected. This script reads the released
source trees (fetched and unpacked as scripts/vllm_catalogue.py does: .py files only, never
imported) with `ast` and writes, per subsystem, every selected function as (name, file, line at
the last release that has it, first release, last release). `raising` selections read each
function's own raise/assert messages with the catalogue's extractor (message_templates.py).
Output is sorted and carries no timestamp: the same trees give the same bytes. A frames.toml entry
with `derive = "ID"` takes its functions from here; never edit the JSON by hand.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from message_templates import extract
from packaging.version import Version
from vllm_catalogue import SOURCE, VERSIONS, _glob, fetch

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "rules" / "maps" / "subsystems.toml"
OUT = ROOT / "vllm_offload_doctor" / "data" / "vllm-frames.json"
SRC_DIR = ROOT / ".vllm-src"
FORMAT = "vllm-frames/1"
KEYS = {"id", "category", "modules", "select", "raising", "callers", "why"}


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    line: int
    end: int
    calls: frozenset[str]  # names it calls (`f(...)` or `x.f(...)`)


@dataclass(frozen=True, slots=True)
class Module:
    functions: tuple[Function, ...]
    raises: tuple[tuple[int, str], ...]  # (line, "Type: template") of each raise/assert


def load_map(path: Path = MAP) -> list[dict[str, Any]]:
    """The subsystems, checked enough that a typo fails here rather than selecting nothing."""
    subsystems = tomllib.loads(path.read_text(encoding="utf-8")).get("subsystem", [])
    seen: set[str] = set()
    for s in subsystems:
        where = f"{path.name}: subsystem {s.get('id', '?')!r}"
        if set(s) - KEYS or not {"id", "category", "modules", "select", "why"} <= set(s):
            raise SystemExit(f"{where}: keys must be {sorted(KEYS)} (raising, callers optional)")
        if s["id"] in seen:
            raise SystemExit(f"{where}: defined twice")
        seen.add(s["id"])
        if s["select"] != "all" and not isinstance(s["select"], list):
            raise SystemExit(f"{where}: select must be 'all' or a list of globs")
        if s["select"] == [] and "raising" not in s:
            raise SystemExit(f"{where}: selects nothing")
        if "raising" in s:
            re.compile(s["raising"])
    return subsystems


def fragment(glob: str) -> str:
    """The path fragment a module glob names: its text before the first `*`."""
    return glob.split("*", 1)[0]


def _calls(node: ast.AST) -> frozenset[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Name):
                names.add(f.id)
            elif isinstance(f, ast.Attribute):
                names.add(f.attr)
    return frozenset(names)


def read_module(text: str, with_raises: bool) -> Module:
    """Its functions (with the names they call, and its raise messages, when `with_raises`)."""
    functions: list[Function] = []

    def visit(body: Iterable[ast.AST]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                calls = _calls(node) if with_raises else frozenset()
                end = node.end_lineno or node.lineno
                functions.append(Function(node.name, node.lineno, end, calls))
            # the statements inside: a def's, a class's, an if/try/with/for/while/match's
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)

    visit(ast.parse(text).body)
    found = extract(text) if with_raises else []
    raises = tuple((f.line, f"{f.type}: {f.template}") for f in found if f.kind == "raise")
    return Module(tuple(functions), raises)


def innermost(functions: Sequence[Function], line: int) -> Function | None:
    inside = [f for f in functions if f.line <= line <= f.end]
    return max(inside, key=lambda f: f.line) if inside else None


def select(sub: dict[str, Any], rel: str, module: Module) -> dict[str, int]:
    """The functions of one module a subsystem selects: name -> its first line in the file."""
    chosen: set[str] = set()
    how = sub["select"]
    globs = how if isinstance(how, list) else []
    for f in module.functions:
        if how == "all" or any(fnmatch.fnmatchcase(f.name, g) for g in globs):
            chosen.add(f.name)
    if "raising" in sub:
        rx = re.compile(sub["raising"])
        for line, message in module.raises:
            f = innermost(module.functions, line)
            if f is not None and rx.search(message):
                chosen.add(f.name)
        if any(_glob(g).match(rel) for g in sub.get("callers", [])):
            grown = True
            while grown:  # callers of a selected function, until nothing is added
                before = len(chosen)
                chosen |= {f.name for f in module.functions if f.calls & chosen}
                grown = len(chosen) != before
    lines: dict[str, int] = {}
    for f in module.functions:
        if f.name in chosen:
            lines[f.name] = min(lines.get(f.name, f.line), f.line)
    return lines


def candidates(tree: Path, subsystems: Sequence[dict[str, Any]]) -> list[Path]:
    """The .py files under the folders the module globs start in (not the whole tree)."""
    found: set[Path] = set()
    for sub in subsystems:
        for glob in sub["modules"]:
            head = fragment(glob)
            base = tree / head.rsplit("/", 1)[0]
            if base.is_dir():
                found.update(base.rglob("*.py") if "**" in glob else base.glob("*.py"))
    return sorted(found)


def scan(
    tree: Path, subsystems: Sequence[dict[str, Any]], cache: dict[str, Module | None]
) -> dict[tuple[str, str, str], int]:
    """(subsystem, function, file) -> line, for one extracted version."""
    out: dict[tuple[str, str, str], int] = {}
    for path in candidates(tree, subsystems):
        rel = path.relative_to(tree).as_posix()
        wanted = [s for s in subsystems if any(_glob(m).match(rel) for m in s["modules"])]
        if not wanted:
            continue
        data = path.read_bytes()
        with_raises = any("raising" in s for s in wanted)
        digest = f"{hashlib.sha1(data).hexdigest()}:{with_raises}"
        if digest not in cache:
            try:
                cache[digest] = read_module(data.decode("utf-8", "replace"), with_raises)
            except SyntaxError:
                cache[digest] = None  # a file this Python cannot parse: nothing selected
        module = cache[digest]
        if module is None:
            continue
        for sub in wanted:
            for name, line in select(sub, rel, module).items():
                out[(sub["id"], name, rel)] = line
    return out


def document(
    subsystems: Sequence[dict[str, Any]], per_version: Iterable[tuple[str, dict[Any, int]]]
) -> dict[str, Any]:
    seen: dict[tuple[str, str, str], list[Any]] = {}  # key -> [line, first, last]
    versions = []
    for version, found in sorted(per_version, key=lambda item: Version(item[0])):
        versions.append(version)
        for key, line in found.items():
            entry = seen.setdefault(key, [line, version, version])
            entry[0], entry[2] = line, version
    out = []
    for sub in subsystems:
        functions = sorted(
            [name, rel, line, first, last]
            for (sid, name, rel), (line, first, last) in seen.items()
            if sid == sub["id"]
        )
        item = {k: sub[k] for k in ("id", "category", "modules", "select") if k in sub}
        item.update({k: sub[k] for k in ("raising", "callers") if k in sub})
        item["paths"] = sorted({fragment(m) for m in sub["modules"]})
        item["functions"] = functions
        out.append(item)
    return {
        "format": FORMAT,
        "generated_by": "scripts/vllm_frames.py from rules/maps/subsystems.toml",
        "source": SOURCE,
        "versions": versions,
        "function": "[name, file, line at the last release, first release, last release]",
        "subsystems": out,
    }


def dump(doc: dict[str, Any]) -> str:
    """JSON with one function per line, so a regenerated file diffs readably."""
    head = {k: v for k, v in doc.items() if k != "subsystems"}
    parts = [json.dumps(head, ensure_ascii=False)[:-1] + ', "subsystems": [']
    subs = []
    for sub in doc["subsystems"]:
        top = {k: v for k, v in sub.items() if k != "functions"}
        rows = ",\n".join(json.dumps(f, ensure_ascii=False) for f in sub["functions"])
        subs.append(json.dumps(top, ensure_ascii=False)[:-1] + ', "functions": [\n' + rows + "]}")
    parts.append(",\n".join(subs))
    parts.append("]}")
    return "\n".join(parts) + "\n"


def build(
    versions: Sequence[str],
    src_dir: Path,
    wheel_dir: Path,
    *,
    fetch_missing: bool = True,
    subsystems: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    subsystems = load_map() if subsystems is None else subsystems
    cache: dict[str, Module | None] = {}
    per_version = []
    for version in versions:
        tree = src_dir / version
        if not (tree / "vllm").is_dir():
            if not fetch_missing:
                raise FileNotFoundError(tree)
            try:
                tree = fetch(version, src_dir, wheel_dir)
            except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile, IndexError) as exc:
                print(f"vllm_frames: {version}: skipped ({exc})", file=sys.stderr)
                continue
        per_version.append((version, scan(tree, subsystems, cache)))
    return document(subsystems, per_version)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--src-dir", type=Path, default=SRC_DIR)
    parser.add_argument("--wheel-dir", type=Path, default=SRC_DIR / "wheels")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    args = parser.parse_args(argv)
    doc = build(args.versions, args.src_dir, args.wheel_dir)
    if len(doc["versions"]) != len(args.versions):
        print("vllm_frames: some versions could not be read; nothing written", file=sys.stderr)
        return 2
    text = dump(doc)
    count = sum(len(s["functions"]) for s in doc["subsystems"])
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run scripts/vllm_frames.py", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date ({count} functions)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {count} functions in {len(doc['subsystems'])} subsystems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
