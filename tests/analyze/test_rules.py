"""Every rule against its fixture logs, meta-checks on the rule set, the example logs end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload_doctor.analyze.engine import Engine
from vllm_offload_doctor.analyze.model import Category, OffloadStatus
from vllm_offload_doctor.analyze.rules import Case, Rule, builtin_rules_dir, load_rules

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "rules"
EXAMPLES = ROOT / "fixtures" / "logs"

RULES: list[Rule] = load_rules()
ENGINE = Engine(RULES)

# The categories a rule may name: every verdict except the two the engine reaches without a rule.
RULE_CATEGORIES = frozenset(Category) - {Category.HEALTHY, Category.UNKNOWN}

CASES = [(rule, case) for rule in RULES for case in rule.cases]


def _case_id(item: tuple[Rule, Case]) -> str:
    rule, case = item
    return f"{rule.id}-{case.log.stem}"


@pytest.mark.parametrize(("rule", "case"), CASES, ids=[_case_id(c) for c in CASES])
def test_rule_case(rule: Rule, case: Case) -> None:
    path = ROOT / case.log
    assert path.is_file(), f"{rule.id}: fixture {case.log} is missing"
    analysis = ENGINE.analyze_file(path)
    fired = [f.rule_id for f in analysis.findings]
    if case.expect == "fire":
        assert rule.id in fired, f"{rule.id} should fire on {case.log}; findings: {fired}"
    else:
        assert rule.id not in fired, f"{rule.id} should stay quiet on {case.log}; findings: {fired}"


# -- meta-tests on the rule set --------------------------------------------------------------


def test_rules_loaded_from_builtin_dir() -> None:
    assert RULES, "no built-in rules found"
    assert all(r.source.parent == builtin_rules_dir() for r in RULES)


def test_rule_ids_unique() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))


def test_case_ids_unique() -> None:
    ids = [_case_id(c) for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_has_fire_and_quiet_case(rule: Rule) -> None:
    expects = {c.expect for c in rule.cases}
    assert "fire" in expects, f"{rule.id} has no fire case"
    assert "quiet" in expects, f"{rule.id} has no quiet case"


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule_fixtures_live_in_its_own_dir(rule: Rule) -> None:
    for case in rule.cases:
        assert case.log.parts[:3] == ("fixtures", "rules", rule.id), case.log
        assert case.log.suffix == ".log", case.log


def test_every_fixture_is_referenced() -> None:
    referenced = {(ROOT / c.log).resolve() for _, c in CASES}
    on_disk = {p.resolve() for p in FIXTURES.rglob("*") if p.is_file()}
    unreferenced = sorted(str(p.relative_to(ROOT)) for p in on_disk - referenced)
    assert not unreferenced, f"fixture files no rule case names: {unreferenced}"


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_links_are_https(rule: Rule) -> None:
    assert rule.links, f"{rule.id} has no link"
    for link in rule.links:
        assert link.startswith("https://"), f"{rule.id}: {link}"


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_category_is_a_fixed_one(rule: Rule) -> None:
    assert rule.category in RULE_CATEGORIES, f"{rule.id}: {rule.category}"


# -- the real example logs end to end --------------------------------------------------------


def test_example_offload_ignored() -> None:
    a = ENGINE.analyze_file(EXAMPLES / "offload-ignored-v2-0.25.1.log")
    assert a.verdict.category is Category.OFFLOAD_IGNORED
    assert a.offload.status is OffloadStatus.IGNORED
    assert "OFF001" in [f.rule_id for f in a.findings]
    assert a.verdict.rule_id == "OFF001"
    assert a.facts.vllm_version == "0.25.1"
    assert a.facts.cpu_offload_gb == 0.5


def test_example_offload_effective() -> None:
    a = ENGINE.analyze_file(EXAMPLES / "offload-effective-v1-0.25.1.log")
    assert a.offload.status is OffloadStatus.EFFECTIVE
    assert a.offload.offloaded_gib == pytest.approx(0.51)
    assert a.verdict.category is Category.HEALTHY
    assert not a.findings


def test_example_oom_weights() -> None:
    a = ENGINE.analyze_file(EXAMPLES / "oom-weights-0.25.1.log")
    assert a.verdict.category is Category.OOM_WEIGHTS
    assert a.verdict.rule_id == "OOM003"
    assert a.offload.status is OffloadStatus.NOT_REQUESTED


def test_example_healthy() -> None:
    a = ENGINE.analyze_file(EXAMPLES / "healthy-0.25.1.log")
    assert a.verdict.category is Category.HEALTHY
    assert not a.findings
    assert a.facts.reached_ready
