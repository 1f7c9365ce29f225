"""The failing-frame map's derived part: data/vllm-frames.json is what scripts/vllm_frames.py reads
in vLLM's released source for the subsystems of rules/maps/subsystems.toml, and every function it
gives places a failure in its subsystem's category (issue 15.2)."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest
from script_loader import load_script

from vllm_offload_doctor.analyze.engine import analyze_lines
from vllm_offload_doctor.analyze.knowledge import builtin_knowledge, derived_path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = derived_path()
MAP = ROOT / "rules" / "maps" / "subsystems.toml"
FRAMES = ROOT / "rules" / "maps" / "frames.toml"
KNOW = builtin_knowledge()
DOC = json.loads(SHIPPED.read_text(encoding="utf-8"))
SUBS = {s["id"]: s for s in DOC["subsystems"]}
ENTRIES = tomllib.loads(FRAMES.read_text(encoding="utf-8"))["frame"]
DERIVING = {
    e["id"]: ([e["derive"]] if isinstance(e["derive"], str) else e["derive"])
    for e in ENTRIES
    if "derive" in e
}


def _script():
    return load_script("vllm_frames")


def _frame(file: str, name: str, line: int = 10) -> list[str]:
    return [
        "Traceback (most recent call last):",
        f'  File "/x/{file}", line {line}, in {name}',
        "AssertionError",
    ]


def test_shipped_file_is_the_script_output():
    mod = _script()
    src = Path(os.environ.get("VLLM_SRC_DIR", mod.SRC_DIR))
    missing = [v for v in mod.VERSIONS if not (src / v / "vllm").is_dir()]
    if missing:
        pytest.skip(
            f"vLLM source trees of {len(missing)} pinned releases not in {src} "
            "(python scripts/vllm_frames.py fetches them; VLLM_SRC_DIR points elsewhere)"
        )
    doc = mod.build(list(mod.VERSIONS), src, src, fetch_missing=False)
    assert mod.dump(doc) == SHIPPED.read_text(encoding="utf-8")


def test_shipped_file_follows_the_hand_map():
    # Without the trees: an edit to subsystems.toml that was not regenerated shows here.
    mod = _script()
    assert DOC["versions"] == list(mod.VERSIONS)
    want = []
    for s in tomllib.loads(MAP.read_text(encoding="utf-8"))["subsystem"]:
        item = {
            k: s[k] for k in ("id", "category", "modules", "select", "raising", "callers") if k in s
        }
        item["paths"] = sorted({mod.fragment(m) for m in s["modules"]})
        want.append(item)
    assert [{k: v for k, v in s.items() if k != "functions"} for s in DOC["subsystems"]] == want


def test_every_subsystem_is_used_and_gave_functions():
    used = {sid for ids in DERIVING.values() for sid in ids}
    assert sorted(SUBS) == sorted(used)
    assert [sid for sid, s in SUBS.items() if not s["functions"]] == []


@pytest.mark.parametrize("entry_id", sorted(DERIVING))
def test_derived_entry_has_fire_and_quiet_cases(entry_id: str) -> None:
    entry = next(f for f in KNOW.frames if f.id == entry_id)
    assert entry.fire and entry.quiet  # test_maps runs them through the analysis


_FILE = re.compile(r'File "(?P<path>[^"]+)", line \d+,? in (?P<fn>\w+)')


@pytest.mark.parametrize(
    ("entry_id", "sid"), [(e, s) for e, ids in sorted(DERIVING.items()) for s in ids]
)
def test_every_derived_subsystem_has_a_fire_case_inside_it(entry_id: str, sid: str) -> None:
    entry = next(f for f in KNOW.frames if f.id == entry_id)
    sub = SUBS[sid]
    names = {f[0] for f in sub["functions"]}
    inside = []
    for line in entry.fire:
        m = _FILE.search(line)
        if m is None:  # a call site: the function was entered
            inside += [line for n in names if f"{n}(" in line]
            continue
        path = re.sub(r"[\\/]+", "/", m.group("path"))
        if any(p in path for p in sub["paths"]) and (sub["select"] == "all" or m["fn"] in names):
            inside.append(line)
    assert inside, f"no fire line of {entry_id} lies in {sid}"


@pytest.mark.parametrize("entry_id", sorted(DERIVING))
def test_every_derived_function_places_the_failure(entry_id: str) -> None:
    entry = next(f for f in KNOW.frames if f.id == entry_id)
    wrong = []
    for sid in DERIVING[entry_id]:
        for name, file, _line, _first, _last in SUBS[sid]["functions"]:
            got = KNOW.frame_entry(name, f"/usr/lib/python3.12/site-packages/{file}")
            if got is None or got.category is not entry.category:
                wrong.append((name, file, got and got.id))
            if entry.calls and SUBS[sid]["select"] != "all":
                hit = KNOW.call_entry(name)
                if hit is None or hit.category is not entry.category:
                    wrong.append((f"{name}(", file, hit and hit.id))
    assert wrong == []


# Functions the hand-written lists before issue 15.2 did not name: the source gives them now.
ONLY_DERIVED = [
    ("vllm/v1/core/kv_cache_utils.py", "_auto_fit_max_model_len", "oom_kv_cache"),
    ("vllm/worker/cpu_worker.py", "_validate_num_cpu_blocks", "oom_kv_cache"),
    ("vllm/distributed/parallel_state.py", "_init_stateless_group", "distributed"),
    ("vllm/model_executor/parallel_utils/custom_all_reduce.py", "init_custom_ar", "distributed"),
    ("vllm/v1/executor/ray_utils.py", "get_bundles_sorted_by_node", "distributed"),
    ("vllm/renderers/hf.py", "safe_apply_chat_template", "tokenizer_template"),
    ("vllm/entrypoints/chat_utils.py", "load_chat_template", "tokenizer_template"),
    ("vllm/platforms/cuda.py", "check_if_supports_dtype", "unsupported_gpu"),
    ("vllm/executor/ray_utils.py", "_wait_until_pg_removed", "distributed"),
    ("vllm/transformers_utils/repo_utils.py", "_try_download_from_hf_hub", "model_download"),
    ("vllm/tokenizers/registry.py", "init_tokenizer_from_config", "tokenizer_template"),
    ("vllm/entrypoints/launchers/cli_args.py", "validate_grpc_port_arg", "bad_args"),
]


@pytest.mark.parametrize(("file", "name", "category"), ONLY_DERIVED, ids=lambda v: str(v)[-30:])
def test_a_function_only_the_source_names_gives_the_category(
    file: str, name: str, category: str
) -> None:
    assert any(f[0] == name and f[1] == file for s in SUBS.values() for f in s["functions"])
    got = analyze_lines(_frame(file, name)).verdict.category
    assert got.value == category


def test_a_derived_name_outside_its_subsystem_is_not_evidence():
    # kv_cache_utils.py's sizing functions count there, not in a file of the same name elsewhere.
    assert (
        analyze_lines(_frame("myproj/sizing.py", "_auto_fit_max_model_len")).verdict.category.value
        != "oom_kv_cache"
    )
    # a frame of kv_cache_utils.py that is no sizing code (block hashing) decides nothing
    assert (
        analyze_lines(
            _frame("vllm/v1/core/kv_cache_utils.py", "hash_block_tokens")
        ).verdict.category.value
        != "oom_kv_cache"
    )


MODULE = """
import ray

def ray_is_available():
    return True

def _check(budget):
    if budget <= 0:
        raise ValueError(f"No available memory for the cache blocks ({budget})")

def size(config):
    _check(config.budget)

def plan(config):
    return size(config)

def hash_tokens(tokens):
    assert tokens, "no tokens"

class Wrapper:
    def execute_method(self, name):
        raise RuntimeError("worker failed")

if ray:
    def initialize_cluster():
        pass
"""


def test_selections_over_one_module():
    mod = _script()
    module = mod.read_module(MODULE, True)

    def sel(**how):  # type: ignore[no-untyped-def]
        sub = {"id": "x", "category": "c", "modules": ["m.py"], "why": "w", **how}
        return sorted(mod.select(sub, "m.py", module))

    names = [
        "_check",
        "execute_method",
        "hash_tokens",
        "initialize_cluster",
        "plan",
        "ray_is_available",
        "size",
    ]
    assert sel(select="all") == names
    assert sel(select=["initialize_*", "ray_*"]) == ["initialize_cluster", "ray_is_available"]
    assert sel(select=[], raising="available memory") == ["_check"]
    # callers of the raising check, transitively, in the files `callers` names only
    assert sel(select=[], raising="available memory", callers=["m.py"]) == [
        "_check",
        "plan",
        "size",
    ]
    assert sel(select=[], raising="available memory", callers=["other.py"]) == ["_check"]


def test_versions_merge_to_first_last_and_the_last_line(tmp_path):
    mod = _script()
    for version, text in (
        ("0.1.0", "def a():\n    pass\n"),
        ("0.2.0", "\n\ndef a():\n    pass\ndef b():\n    pass\n"),
    ):
        (tmp_path / version / "vllm" / "engine").mkdir(parents=True)
        (tmp_path / version / "vllm" / "engine" / "arg_utils.py").write_text(text)
    sub = {
        "id": "args",
        "category": "bad_args",
        "modules": ["vllm/engine/arg_utils.py"],
        "select": "all",
        "why": "w",
    }
    doc = mod.build(["0.2.0", "0.1.0"], tmp_path, tmp_path, fetch_missing=False, subsystems=[sub])
    assert doc["versions"] == ["0.1.0", "0.2.0"]
    assert doc["subsystems"][0]["paths"] == ["vllm/engine/arg_utils.py"]
    assert doc["subsystems"][0]["functions"] == [
        ["a", "vllm/engine/arg_utils.py", 3, "0.1.0", "0.2.0"],
        ["b", "vllm/engine/arg_utils.py", 5, "0.2.0", "0.2.0"],
    ]
    again = mod.build(["0.1.0", "0.2.0"], tmp_path, tmp_path, fetch_missing=False, subsystems=[sub])
    assert mod.dump(again) == mod.dump(doc)  # no timestamp, no order from the command line
