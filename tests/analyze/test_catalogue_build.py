"""scripts/vllm_catalogue.py and scripts/message_templates.py on source trees and a wheel built here:
the templates each call form gives, first/last/missing releases, byte-stable output, `build --check`
and `query`. No network, no real vLLM."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def scripts() -> tuple[ModuleType, ModuleType]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module("message_templates"), importlib.import_module(
            "vllm_catalogue"
        )
    finally:
        sys.path.remove(str(SCRIPTS))


def _templates(mt: ModuleType, source: str) -> list[tuple[str, str, str]]:
    return [(f.template, f.kind, f.type) for f in mt.extract(source)]


def test_call_forms_become_templates(scripts: tuple[ModuleType, ModuleType]) -> None:
    mt, _ = scripts
    source = """
import logging
logger = logging.getLogger(__name__)

def size(cfg, need, avail, n):
    if need > avail:
        raise ValueError(
            f"({need:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({avail:.2f} GiB). Model {cfg.model!r}."
        )
    msg = "max seq len (%d) is larger than " % cfg.max_model_len
    msg += "the KV cache ({})".format(n)
    raise RuntimeError(msg)

def log(x, name):
    logger.warning("cap of roughly 50%% of RAM")
    logger.info("Loading took %.2f GiB on %s", x, name)
    logger.info("%(who)s is %(what)s", {"who": name, "what": "ready"})
    assert x > 0, f"bad {x}"
    def inner():
        logger.error("inner {braces} %s", name)
    raise SystemExit(1)

def load(n):
    try:
        n()
    except MemoryError as e:
        msg = (
            "Failed to load model - not enough GPU memory. "
            "Try lowering --gpu-memory-utilization."
        )
        combined = f"{msg} (original error: {e})"
        logger.error(combined)
"""
    assert _templates(mt, source) == [
        (
            "({need:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            "memory ({avail:.2f} GiB). Model {cfg.model!r}.",
            "raise",
            "ValueError",
        ),
        (
            "max seq len ({cfg.max_model_len:d}) is larger than the KV cache ({n})",
            "raise",
            "RuntimeError",
        ),
        # logging %-formats only with arguments: without them the log prints `50%%` as written.
        ("cap of roughly 50%% of RAM", "log", "warning"),
        ("Loading took {x:.2f} GiB on {name}", "log", "info"),
        ("{name} is ready", "log", "info"),
        ("bad {x}", "raise", "AssertionError"),
        # Literal braces are doubled, as in str.format; the nested function is read once.
        ("inner {{braces}} {name}", "log", "error"),
        # A message variable inside an f-string is read through, not left as {msg}.
        (
            "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization. "
            "(original error: {e})",
            "log",
            "error",
        ),
    ]


def test_unreadable_source_gives_nothing(scripts: tuple[ModuleType, ModuleType]) -> None:
    mt, _ = scripts
    assert mt.extract("def broken(:\n") == []
    assert mt.extract("raise ValueError(make_message())\nlogger.info(build())\n") == []


KV_OLD = """
def check(n, max_model_len):
    if n == 0:
        raise ValueError("No available memory for the cache blocks.")
    raise ValueError(f"The model's max seq len ({max_model_len}) is larger than KV cache ({n}).")
"""
KV_NEW = KV_OLD.replace("The model's", "The models's")
MODEL = 'raise ValueError("a model definition, never read")\n'
RUNNER = (
    'import logging\nlogger = logging.getLogger(__name__)\nlogger.info("Using V2 Model Runner")\n'
)


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    """0.1.0 and 0.2.0 as extracted trees, 0.10.0 as a wheel (so version order is not text order)."""
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    _tree(
        src / "0.1.0",
        {"vllm/worker/worker.py": KV_OLD, "vllm/model_executor/models/llama.py": MODEL},
    )
    _tree(src / "0.2.0", {"vllm/worker/worker.py": KV_NEW, "vllm/v1/worker/gpu_worker.py": RUNNER})
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "vllm-0.10.0-cp38-abi3-manylinux1_x86_64.whl", "w") as zf:
        zf.writestr("vllm/worker/worker.py", KV_OLD)
        zf.writestr("vllm/v1/worker/gpu_worker.py", RUNNER)
        zf.writestr("vllm/_C.abi3.so", b"\0binary")
        zf.writestr("../escape.py", "raise ValueError('outside the tree')\n")
    return src, wheels


def _build(
    vc: ModuleType,
    src: Path,
    wheels: Path,
    out: Path,
    *extra: str,
    versions: tuple[str, ...] = ("0.1.0", "0.2.0", "0.10.0"),
) -> int:
    argv = ["build", "--versions", *versions, "--src-dir", str(src), "--wheel-dir", str(wheels)]
    return int(vc.main([*argv, "--out", str(out), *extra]))


def test_build_records_first_last_and_missing_releases(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    _, vc = scripts
    src, wheels = _fixture(tmp_path)
    out = tmp_path / "messages.json"
    assert _build(vc, src, wheels, out) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["versions"] == ["0.1.0", "0.2.0", "0.10.0"]
    assert doc["count"] == len(doc["messages"])
    got = {
        (m["template"], m["file"]): (m["first"], m["last"], m.get("missing"))
        for m in doc["messages"]
    }
    assert got == {
        ("No available memory for the cache blocks.", "vllm/worker/worker.py"): (
            "0.1.0",
            "0.10.0",
            None,
        ),
        (
            "The model's max seq len ({max_model_len}) is larger than KV cache ({n}).",
            "vllm/worker/worker.py",
        ): ("0.1.0", "0.10.0", ["0.2.0"]),
        (
            "The models's max seq len ({max_model_len}) is larger than KV cache ({n}).",
            "vllm/worker/worker.py",
        ): ("0.2.0", "0.2.0", None),
        ("Using V2 Model Runner", "vllm/v1/worker/gpu_worker.py"): ("0.2.0", "0.10.0", None),
    }
    # The wheel was unpacked (only its .py files, nothing outside the tree) and deleted.
    assert sorted(
        p.relative_to(src).as_posix() for p in (src / "0.10.0").rglob("*") if p.is_file()
    ) == [
        "0.10.0/vllm/v1/worker/gpu_worker.py",
        "0.10.0/vllm/worker/worker.py",
    ]
    assert not (src / "escape.py").exists()
    assert not list(wheels.glob("*.whl"))


def test_build_is_byte_stable_and_check_notices_drift(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, vc = scripts
    src, wheels = _fixture(tmp_path)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert _build(vc, src, wheels, first) == 0
    # Another order of --versions and a warm source cache give the same bytes.
    assert _build(vc, src, wheels, second, versions=("0.10.0", "0.2.0", "0.1.0")) == 0
    assert first.read_bytes() == second.read_bytes()
    assert _build(vc, src, wheels, first, "--check") == 0
    text = first.read_text(encoding="utf-8")
    first.write_text(text.replace("The models's", "The model has"), encoding="utf-8")
    capsys.readouterr()
    assert _build(vc, src, wheels, first, "--check") == 1
    assert "stale: 1 entries to add or change, 1 to remove" in capsys.readouterr().err
    # --check never writes.
    assert "The model has" in first.read_text(encoding="utf-8")


def test_build_skips_a_release_it_cannot_read(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, vc = scripts
    src, wheels = _fixture(tmp_path)
    (wheels / "vllm-0.3.0-py3-none-any.whl").write_bytes(b"not a zip")
    out = tmp_path / "m.json"
    assert _build(vc, src, wheels, out, versions=("0.1.0", "0.3.0")) == 0
    assert "0.3.0: skipped" in capsys.readouterr().err
    assert json.loads(out.read_text(encoding="utf-8"))["versions"] == ["0.1.0"]


def _doc(tmp_path: Path) -> Path:
    messages = [
        {
            "template": "No available memory for the cache blocks.",
            "kind": "raise",
            "type": "ValueError",
            "file": "vllm/worker/worker.py",
            "line": 4,
            "first": "0.4.0",
            "last": "0.10.2",
        },
        {
            "template": "No available memory for the cache blocks.",
            "kind": "raise",
            "type": "ValueError",
            "file": "vllm/v1/core/kv_cache_utils.py",
            "line": 9,
            "first": "0.7.0",
            "last": "0.33.0",
        },
        {
            "template": "Total CPU offloaded parameters: {n}",
            "kind": "log",
            "type": "info",
            "file": "vllm/model_executor/offloader/uva.py",
            "line": 68,
            "first": "0.17.0",
            "last": "0.33.0",
        },
        {
            "template": "Unknown offload mode: {mode}",
            "kind": "raise",
            "type": "ValueError",
            "file": "vllm/model_executor/offloader/prefetch.py",
            "line": 5,
            "first": "0.17.0",
            "last": "0.20.0",
            "missing": ["0.18.0"],
        },
    ]
    versions = ["0.4.0", "0.7.0", "0.10.2", "0.17.0", "0.18.0", "0.20.0", "0.33.0"]
    path = tmp_path / "doc.json"
    path.write_text(
        json.dumps({"versions": versions, "count": len(messages), "messages": messages})
    )
    return path


def test_query_filters_and_groups(
    scripts: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, vc = scripts
    data = _doc(tmp_path)
    assert vc.main(["query", "--data", str(data), "--grep", "OFFLOAD"]) == 0
    out = capsys.readouterr().out.splitlines()
    # Newest first; one block per template.
    assert out == [
        "Total CPU offloaded parameters: {n}",
        "    log info  vllm/model_executor/offloader/uva.py:68  0.17.0–0.33.0",
        "Unknown offload mode: {mode}",
        "    raise ValueError  vllm/model_executor/offloader/prefetch.py:5  0.17.0–0.20.0 (not in 0.18.0)",
    ]
    assert (
        vc.main(["query", "--data", str(data), "--category", "oom_kv_cache", "--until", "0.8.0"])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "No available memory for the cache blocks.",
        "    raise ValueError  vllm/v1/core/kv_cache_utils.py:9  0.7.0–0.33.0",
        "    raise ValueError  vllm/worker/worker.py:4  0.4.0–0.10.2",
    ]
    assert (
        vc.main(
            [
                "query",
                "--data",
                str(data),
                "--grep",
                "cache blocks",
                "--since",
                "0.11.0",
                "--format",
                "json",
            ]
        )
        == 0
    )
    [group] = json.loads(capsys.readouterr().out)
    assert [e["file"] for e in group["entries"]] == ["vllm/v1/core/kv_cache_utils.py"]
    assert vc.main(["query", "--data", str(data), "--kind", "log", "--grep", "cache"]) == 1
