"""Logs written for this test from vLLM's source messages, in versions, collectors and wordings
the rules were not built on (journald + CRLF, docker compose, Ray `(pid=, ip=)`, k8s ISO time,
ANSI, V0 and V2 runners): the failure class must still be named, and offload never falsely
`ignored`."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload_doctor.analyze import analyze_file, analyze_lines

HERE = Path(__file__).parent / "unseen"

CASES = {
    # name: (category, rule or None, offload status, words the summary must hold)
    "wsl2-pinned-crlf-journald.log": ("wsl", "WSL001", None, ()),
    "ray-actor-died.log": ("unknown", None, "not_requested", ("died without raising", "OOM killer")),
    "kv-offload-lmcache-oom.log": ("oom_weights", "OOM003", "not_requested", ("KV-cache offloading", "LMCache")),
    "v0-docker-kv-blocks.log": ("oom_kv_cache", None, "not_requested", ()),
    "worker-died-exit-9.log": ("unknown", None, "effective", ("2 x --cpu-offload-gb", "about 96 GiB")),
    "hf-gated-ray-prefix.log": ("model_download", "DL001", "not_requested", ()),
    "uva-not-available-v2-wsl.log": ("offload_error", "OFF006", None, ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unseen_log(name: str) -> None:
    category, rule, offload, words = CASES[name]
    path = HERE / name
    a = analyze_file(path)
    b = analyze_lines(path.read_bytes().decode("utf-8").split("\n"))
    assert a.verdict.category.value == b.verdict.category.value == category
    if rule is not None:
        assert a.verdict.rule_id == rule
    if offload is not None:
        assert a.offload.status.value == offload
    assert a.offload.status.value != "ignored"
    for word in words:
        assert word in a.verdict.summary
    # Every verdict shows the lines it rests on.
    assert (a.findings and a.findings[0].evidence) or a.notable


def test_the_directory_holds_only_the_listed_logs() -> None:
    assert sorted(p.name for p in HERE.iterdir()) == sorted(CASES)
