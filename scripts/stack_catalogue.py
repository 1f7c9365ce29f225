#!/usr/bin/env python3
"""Build vllm_offload_doctor/data/stack-messages.json: messages of the libraries under vLLM.

    python scripts/stack_catalogue.py            # fetch the pinned wheels into .stack-cache/, build
    python scripts/stack_catalogue.py --check    # exit 1 if the shipped file is stale

Wheels in PINS are fetched with `pip download --no-deps` into .stack-cache/ (gitignored) and read as
zip members, never imported or installed. Each source says where its strings come from:

- cuda-runtime: the `cudaError` enum with its doc comments (driver_types.h of the runtime wheel).
- nccl: the `ncclResult_t` enum (nccl.h) paired with ncclGetErrorString's texts (libnccl's strings).
- errno-linux / errno-macos / gai-glibc: the errno tables of the Linux kernel's uapi headers and of
  macOS's <sys/errno.h>, and glibc's getaddrinfo codes (<netdb.h>), as the ziglang wheel ships them
  for its cross-compiling libc (the texts are the headers' comments, which strerror mostly prints).
- safetensors / tokenizers: `Error while ...` format strings in the Rust extension's string table.
- torch: Python raises of torch/cuda/__init__.py and the CUDA messages of libc10_cuda's strings.
- triton / ray / transformers / huggingface_hub: exception classes and raise messages of the
  named Python files (ast, never executed); ray also the raylet's memory-monitor kill notes.

Which entry lends which category is not decided here: rules/maps/stack.toml says. Entries of
several pinned versions of one package merge, listing the versions that hold them. Output is
sorted and carries no timestamp. Never edit the JSON by hand.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "vllm_offload_doctor" / "data" / "stack-messages.json"
CACHE = ROOT / ".stack-cache"
FORMAT = "stack-messages/2"
PLATFORM = (
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_12_x86_64",
)
ZIG = "ziglang/lib/libc/include/"

Entry = dict[str, Any]

_ENUM = re.compile(r"/\*\*((?:(?!\*/).)*)\*/\s*(cudaError\w+)\s*=\s*(\d+)", re.S)
_RUST = re.compile(rb"Error while [a-z][A-Za-z ]{4,60}[A-Za-z]")
_DEFINE = re.compile(r"^#\s*define\s+(E[A-Z0-9_]+)\s+(-?\d+)\s*/\*\s*(.*?)\.?\s*\*/", re.M)
_NCCL_ENUM = re.compile(r"(nccl[A-Z]\w+)\s*=\s*(\d+)")
_C_STRING = re.compile(rb"[A-Z][\x20-\x7e]{15,300}")
_RAY_KILL = re.compile(rb"[A-Z][\x20-\x7e]{0,60}killed due to [\x20-\x7e]{4,120}?\.")


def cuda_errors(header: str) -> list[Entry]:
    """Each `cudaErrorX = N` of the cudaError enum with the first sentence of its doc comment."""
    body = header[header.find("enum __device_builtin__ cudaError") :]
    body = body[: body.find("};")]
    out = []
    for doc, name, value in _ENUM.findall(body):
        text = " ".join(line.strip().lstrip("*").strip() for line in doc.splitlines()).strip()
        text = re.sub(r"\\ref\s+\S+\s*\"([^\"]*)\"|\\p\s+|\\ref\s+", r"\1", text)
        first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
        out.append({"name": name, "code": int(value), "kind": "code", "template": first})
    return out


def rust_strings(blob: bytes) -> list[Entry]:
    """`Error while ...` format strings in an extension's string table; a Debug `{:?}` follows."""
    found = sorted({m.decode() for m in _RUST.findall(blob)})
    return [{"name": s, "kind": "text", "template": s + ": {detail}"} for s in found]


def nccl_results(header: Any, blob: Any) -> list[Entry]:
    """`ncclResult_t` names with the text ncclGetErrorString gives them: the library string that
    starts with the name's words (`ncclInvalidUsage` -> "invalid usage (run with ...)")."""
    body = header[header.find("typedef enum { ncclSuccess") :]
    body = body[: body.find("} ncclResult_t")]
    out = []
    for name, value in _NCCL_ENUM.findall(body):
        if name in ("ncclSuccess", "ncclNumResults"):
            continue
        words = re.sub(r"(?<!^)(?=[A-Z])", " ", name[4:]).lower().removesuffix(" error")
        pat = re.compile(
            rb"(?<=\x00)((?:unhandled )?"
            + re.escape(words.encode())
            + rb"[\x20-\x7e]{0,100})(?=\x00)"
        )
        texts = sorted({m.decode() for m in pat.findall(blob)}, key=lambda s: (-len(s), s))
        if texts:
            out.append({"name": name, "code": int(value), "kind": "code", "template": texts[0]})
    return out


def errno_table(*headers: str) -> list[Entry]:
    """`#define EXXX N /* text */` lines; Python prints them as `[Errno N] text`."""
    out: dict[str, Entry] = {}
    for header in headers:
        for name, value, text in _DEFINE.findall(header):
            if text:
                out.setdefault(
                    name, {"name": name, "code": int(value), "kind": "errno", "template": text}
                )
    return list(out.values())


def c_strings(blob: bytes, needle: str) -> list[Entry]:
    """Sentences of a shared object's strings that hold `needle`: three words or more, no mangled
    symbol, no internal assert (a bug report, not a cause)."""
    out = {}
    for m in _C_STRING.findall(blob):
        raw = m.decode()
        text = raw.rstrip()
        if needle in text and len(text.split()) >= 3 and "INTERNAL ASSERT" not in text:
            # 'CUDA driver error: ' is a head the library completes with the driver's text
            head = raw.endswith(": ")
            name = text.rstrip(":") if head else text
            out[name] = {
                "name": name,
                "kind": "text",
                "template": text + " {detail}" if head else text,
            }
    return [out[k] for k in sorted(out)]


def ray_kills(blob: bytes) -> list[Entry]:
    """The raylet's memory-monitor notes (`Task was killed due to the node running low on memory.`)."""
    found = sorted({m.decode().strip() for m in _RAY_KILL.findall(blob)})
    return [{"name": s, "kind": "text", "template": s} for s in found]


def _template(node: ast.AST | None, names: dict[str, ast.AST]) -> str | None:
    """A string, f-string, `a + b` or `"...".format()` of literals as a template (`{}` holes)."""
    if isinstance(node, ast.Name) and node.id in names:
        return _template(names[node.id], {})
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
        return "".join(str(p) for p in parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left, names), _template(node.right, names)
        return left + right if left is not None and right is not None else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        return _template(node.func.value, names)
    return None


def _literal_core(template: str) -> str:
    first = template.strip().split("\n", 1)[0].strip()
    return max(re.split(r"\{[^{}]*\}", first), key=len).strip()


def python_messages(source: str) -> list[Entry]:
    """Exception classes (name, first docstring sentence or `__str__`'s f-string) and the messages of
    `raise X("...")`, with module-level `*_ERROR` message constants and `msg = ...; raise X(msg)`."""
    tree = ast.parse(source)
    out: dict[str, Entry] = {}
    consts = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id.endswith("_ERROR")
    }
    for value in consts.values():
        text = _template(value, {})
        if text and len(_literal_core(text)) >= 16:
            first = text.strip().split("\n", 1)[0].strip()
            out.setdefault(first, {"name": first, "kind": "text", "template": text.strip()})
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and re.search(r"(Error|Exception|Resources)$", node.name):
            doc = (ast.get_docstring(node) or "").strip()
            text = re.split(r"(?<=\.)\s", " ".join(doc.split()), maxsplit=1)[0] if doc else ""
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__str__":
                    ret = next((r for r in ast.walk(item) if isinstance(r, ast.Return)), None)
                    text = _template(ret.value if ret else None, {}) or text
            out.setdefault(node.name, {"name": node.name, "kind": "class", "template": text})
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local = {
                t.id: n.value
                for n in ast.walk(node)
                if isinstance(n, ast.Assign)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            for r in ast.walk(node):
                if not (isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call) and r.exc.args):
                    continue
                text = _template(r.exc.args[0], local)
                if text is None or len(_literal_core(text)) < 16:
                    continue
                first = text.strip().split("\n", 1)[0].strip()
                out.setdefault(first, {"name": first, "kind": "text", "template": text.strip()})
    return list(out.values())


def _file(member: str, entries: list[Entry]) -> list[Entry]:
    return [{"file": member.rsplit("/", 1)[-1], **e} for e in entries]


def _py(blobs: dict[str, bytes]) -> list[Entry]:
    return [e for m, b in blobs.items() for e in _file(m, python_messages(b.decode("utf-8")))]


def _torch(blobs: dict[str, bytes]) -> list[Entry]:
    (py, py_blob), (so, so_blob) = blobs.items()
    return _file(py, python_messages(py_blob.decode())) + _file(so, c_strings(so_blob, "CUDA"))


def _ray(blobs: dict[str, bytes]) -> list[Entry]:
    *py, (raylet, blob) = blobs.items()
    return _py(dict(py)) + _file(raylet, ray_kills(blob))


def _text(blobs: dict[str, bytes]) -> list[str]:
    return [b.decode() for b in blobs.values()]


# library, pip requirement, members to read, how to read them (member -> bytes, in order)
Source = tuple[str, str, tuple[str, ...], Callable[[dict[str, bytes]], list[Entry]]]
PINS: tuple[Source, ...] = (
    (
        "cuda-runtime",
        "nvidia-cuda-runtime-cu12==12.4.127",
        ("nvidia/cuda_runtime/include/driver_types.h",),
        lambda b: cuda_errors(*_text(b)),
    ),
    (
        "nccl",
        "nvidia-nccl-cu12==2.27.3",
        ("nvidia/nccl/include/nccl.h", "nvidia/nccl/lib/libnccl.so.2"),
        lambda b: nccl_results(*(x.decode() if m.endswith(".h") else x for m, x in b.items())),
    ),
    (
        "errno-linux",
        "ziglang==0.13.0",
        (ZIG + "any-linux-any/asm-generic/errno-base.h", ZIG + "any-linux-any/asm-generic/errno.h"),
        lambda b: errno_table(*_text(b)),
    ),
    (
        "errno-macos",
        "ziglang==0.13.0",
        (ZIG + "any-macos-any/sys/errno.h",),
        lambda b: errno_table(*_text(b)),
    ),
    (
        "gai-glibc",
        "ziglang==0.13.0",
        (ZIG + "generic-glibc/netdb.h",),
        lambda b: errno_table(*_text(b)),
    ),
    (
        "safetensors",
        "safetensors==0.4.5",
        ("safetensors/_safetensors_rust.cpython-311-x86_64-linux-gnu.so",),
        lambda b: rust_strings(*b.values()),
    ),
    (
        "tokenizers",
        "tokenizers==0.22.1",
        ("tokenizers/tokenizers.abi3.so",),
        lambda b: rust_strings(*b.values()),
    ),
    ("torch", "torch==2.9.0", ("torch/cuda/__init__.py", "torch/lib/libc10_cuda.so"), _torch),
    ("triton", "triton==3.5.1", ("triton/runtime/errors.py", "triton/compiler/errors.py"), _py),
    (
        "ray",
        "ray==2.50.1",
        ("ray/exceptions.py", "ray/_private/utils.py", "ray/core/src/ray/raylet/raylet"),
        _ray,
    ),
    ("transformers", "transformers==4.40.1", ("transformers/utils/import_utils.py",), _py),
    ("transformers", "transformers==4.57.1", ("transformers/utils/import_utils.py",), _py),
    (
        "huggingface_hub",
        "huggingface_hub==0.36.0",
        ("huggingface_hub/errors.py", "huggingface_hub/file_download.py"),
        _py,
    ),
)


def _prefix(req: str) -> str:
    name, version = req.split("==")
    return f"{name.replace('-', '_')}-{version}-"


def cached(req: str, cache: Path = CACHE) -> Path | None:
    return next(iter(sorted(cache.glob(_prefix(req) + "*.whl"))), None)


def fetch() -> None:
    CACHE.mkdir(exist_ok=True)
    for req in dict.fromkeys(p[1] for p in PINS):
        if cached(req) is None:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                *PLATFORM,
                "-d",
                str(CACHE),
                req,
            ]
            subprocess.run(cmd, check=True)


def source_entries(source: Source, cache: Path = CACHE) -> list[Entry]:
    library, req, members, read = source
    wheel = cached(req, cache)
    if wheel is None:
        raise FileNotFoundError(f"no cached wheel for {req} in {cache}")
    package, version = req.split("==")
    with zipfile.ZipFile(wheel) as z:
        found = read({m: z.read(m) for m in members})
    files = ", ".join(
        m.split("include/", 1)[1] if "include/" in m else m.rsplit("/", 1)[-1] for m in members
    )
    return [
        {"library": library, "package": package, "versions": [version], "file": files, **e}
        for e in found
    ]


def merge(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per library and name; versions of every pin that holds it (first pin's template)."""
    out: dict[tuple[str, str], Entry] = {}
    for e in entries:
        key = (e["library"], e["name"])
        if key in out:
            out[key]["versions"] = sorted(set(out[key]["versions"]) | set(e["versions"]))
        else:
            out[key] = dict(e)
    return sorted(out.values(), key=lambda m: (m["library"], m["name"]))


def build(cache: Path = CACHE) -> dict[str, Any]:
    messages = merge(e for s in PINS for e in source_entries(s, cache))
    return {
        "format": FORMAT,
        "generated_by": "scripts/stack_catalogue.py",
        "sources": sorted({p[1] for p in PINS}),
        "messages": messages,
    }


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
