"""The vLLM message catalogue (data/vllm-messages.json) and the rules that cite it: every message a
rule names in `vllm_source` is in the catalogue, and the rule's patterns match it as a log shows it,
so a rule and vLLM's wording cannot drift apart unnoticed. `rules ID` shows the files and releases."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import regex

from vllm_offload_doctor.analyze import catalogue
from vllm_offload_doctor.analyze.rules import Rule, SourceRef, load_rule, load_rules
from vllm_offload_doctor.cli import main
from vllm_offload_doctor.errors import RuleFileError

CAT = catalogue.load()
RULES = load_rules()
CITING = [r for r in RULES if r.vllm_source]


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code or 0)


def _rule(rule_id: str) -> Rule:
    return next(r for r in RULES if r.id == rule_id)


def test_catalogue_file_is_well_formed() -> None:
    doc = json.loads(catalogue.data_path().read_text(encoding="utf-8"))
    assert doc["count"] == len(doc["messages"]) == len(CAT.messages)
    ordered = list(CAT.versions)
    for m in CAT.messages:
        assert m.kind in ("raise", "log")
        assert m.file.startswith("vllm/") and m.file.endswith(".py")
        assert ordered.index(m.first) <= ordered.index(m.last)
        assert all(
            ordered.index(m.first) < ordered.index(v) < ordered.index(m.last) for v in m.missing
        )
    # One entry per (template, kind, type, file), in the generator's sorted order.
    keys = [(m.template, m.kind, m.type, m.file) for m in CAT.messages]
    assert len(keys) == len(set(keys))
    assert [(m.file, m.line) for m in CAT.messages] == sorted(
        (m.file, m.line) for m in CAT.messages
    )


def test_rules_that_quote_vllm_cite_it() -> None:
    # The rules written from vLLM's own messages; a rule losing its citations fails here.
    assert {r.id for r in CITING} >= {"OOM001", "OOM002", "OFF001", "OFF002", "GPU001", "TOK001"}


@pytest.mark.parametrize("rule", CITING, ids=lambda r: r.id)
def test_cited_messages_exist_and_the_rule_matches_them(rule: Rule) -> None:
    assert catalogue.problems(rule, CAT) == []
    for cited in catalogue.cited(rule, CAT):
        assert cited.found, cited.template
        for message, patterns in cited.found:
            assert patterns, (message.where(), message.template)


def test_a_pattern_that_no_longer_matches_a_cited_message_is_reported() -> None:
    rule = _rule("OOM002")
    # vLLM wrote "models's" up to 0.21.0 and "model's" after: a pattern for one spelling only.
    old_only = regex.compile(r"To serve at least one request with the models's max seq len")
    drifted = dataclasses.replace(rule, patterns=(old_only,), keywords=("KV cache is needed",))
    found = catalogue.problems(drifted, CAT)
    assert found
    assert all("no pattern matches" in p for p in found)
    assert any("the model's max seq len" in p for p in found)
    assert not any("the models's max seq len" in p for p in found)


def test_a_citation_missing_from_the_catalogue_is_reported() -> None:
    rule = dataclasses.replace(
        _rule("OFF002"), vllm_source=(SourceRef("CPU tensor must be pinned!"),)
    )
    assert catalogue.problems(rule, CAT) == [
        "OFF002: vllm_source names a message not in the catalogue: 'CPU tensor must be pinned!'"
    ]


def test_an_example_must_be_an_instance_of_its_template() -> None:
    rule = _rule("GPU001")
    [ref, *_] = [r for r in rule.vllm_source if r.example is not None]
    assert catalogue.instance_of(ref.template, ref.example or "")
    wrong = dataclasses.replace(ref, example=(ref.example or "").replace("use float16", "use fp16"))
    problems = catalogue.problems(dataclasses.replace(rule, vllm_source=(wrong,)), CAT)
    assert len(problems) == 1 and "is not an instance of" in problems[0]


def test_instance_of_reads_placeholders_and_literal_braces() -> None:
    template = "Loading took {x:.2f} GiB for {{literal}} on {name}"
    assert catalogue.instance_of(template, "Loading took 1.50 GiB for {literal} on rank 0")
    assert not catalogue.instance_of(template, "Loading took 1.50 GiB for literal on rank 0")
    assert not catalogue.instance_of(
        template, "Loading took 1.50 GiB for {literal} on"
    )  # nothing after


def test_rendered_samples_follow_format_specs() -> None:
    message = catalogue.Message(
        "need {n:.2f} GiB, have {k:d} blocks, model {m!r}",
        "raise",
        "ValueError",
        "f.py",
        1,
        "0.1",
        "0.1",
    )
    texts = catalogue.samples(message)
    assert "need 1.00 GiB, have 1 blocks, model '1'" in texts
    assert "ValueError: need 1.50 GiB, have 1 blocks, model '1.50'" in texts


def test_keywords_gate_the_rules_own_patterns_as_in_analyze() -> None:
    # A pattern that matches but whose keyword the line lacks would never see the line in analyze.
    rule = _rule("OFF002")
    gated = dataclasses.replace(rule, keywords=("no such keyword",))
    message = next(c.found[0][0] for c in catalogue.cited(rule, CAT))
    assert catalogue.covering(rule, message)
    assert catalogue.covering(gated, message) == ()


def test_rules_id_shows_cited_files_and_releases(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("rules", "OOM002", "--verbose") == 0
    out = capsys.readouterr().out
    cited = catalogue.cited(_rule("OOM002"), CAT)
    assert f"vLLM source: {len(cited)} messages cited" in out
    for c in cited:
        for message, _ in c.found:
            assert f"{message.kind} {message.type}  {message.where()}  {message.span()}" in out


def test_rules_id_json_lists_cited_messages(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("rules", "GPU001", "--format", "json") == 0
    source = json.loads(capsys.readouterr().out)["vllm_source"]
    rule = _rule("GPU001")
    assert [c["template"] for c in source["cited"]] == [r.template for r in rule.vllm_source]
    assert [c["example"] for c in source["cited"]] == [r.example for r in rule.vllm_source]
    for c in source["cited"]:
        assert c["found"] and all(f["first"] in CAT.versions and f["patterns"] for f in c["found"])


def test_rules_json_list_has_each_rules_vllm_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("rules", "--format", "json") == 0
    listed = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert _cli("rules", "GPU001", "--format", "json") == 0
    assert listed["GPU001"]["vllm_source"] == json.loads(capsys.readouterr().out)["vllm_source"]
    for r in load_rules():
        cited = [c["template"] for c in listed[r.id]["vllm_source"]["cited"]]
        assert cited == [ref.template for ref in r.vllm_source], r.id


RULE = """\
id = "TST001"
title = "A test rule"
severity = "error"
category = "crash_other"
keywords = ["boom"]
patterns = ['boom']
message = "m"
remedy = "r"
"""


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('"boom"', "vllm_source: must be a list"),
        ("[1]", "vllm_source[0]: must be a template or a {template, example} table"),
        ('[""]', "vllm_source[0]: must be a template or a {template, example} table"),
        ('[{ example = "boom" }]', "vllm_source[0].template: must be a non-empty string"),
        (
            '[{ template = "boom", example = "" }]',
            "vllm_source[0].example: must be a non-empty string",
        ),
        ('[{ template = "boom", line = 3 }]', "vllm_source[0].line: unknown key"),
    ],
)
def test_bad_vllm_source_is_a_rule_file_error(tmp_path: Path, value: str, why: str) -> None:
    path = tmp_path / "TST001.toml"
    path.write_text(RULE + f"vllm_source = {value}\n", encoding="utf-8")
    with pytest.raises(RuleFileError, match=regex.escape(why)):
        load_rule(path)


def test_vllm_source_loads_templates_and_examples(tmp_path: Path) -> None:
    path = tmp_path / "TST001.toml"
    path.write_text(
        RULE + 'vllm_source = ["boom {n}", { template = "boom {x}", example = "boom 3" }]\n',
        encoding="utf-8",
    )
    assert load_rule(path).vllm_source == (SourceRef("boom {n}"), SourceRef("boom {x}", "boom 3"))


def test_rules_id_names_shapes_and_silence(capsys: pytest.CaptureFixture[str]) -> None:
    # CRASH001's "any Error: line" pattern matches thousands of messages: reported as a shape.
    crash = _rule("CRASH001")
    broad = catalogue.cite(crash, CAT).generic
    assert broad
    assert _cli("rules", "CRASH001", "--verbose") == 0
    out = capsys.readouterr().out
    for index, _, count in broad:
        assert f"pattern {index + 1} matches {count} catalogued messages: a shape" in out
    assert "matches 0 catalogued" not in out
    # PORT001 reads the OS's errno text, which no vLLM file raises.
    assert _cli("rules", "PORT001", "--verbose") == 0
    assert "vLLM source: no catalogued message matches" in capsys.readouterr().out
