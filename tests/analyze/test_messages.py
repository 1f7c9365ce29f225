"""Rule messages render only the facts a log gives: no `?`, `{field}` or `[[` left over (issue 8.9)."""

from __future__ import annotations

import pytest

from vllm_offload_doctor.analyze.rules import fields_outside_segments, load_rules, render_message

RULES = load_rules()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_field_sits_in_an_optional_segment(rule) -> None:  # type: ignore[no-untyped-def]
    assert fields_outside_segments(rule.message) == []
    assert fields_outside_segments(rule.remedy) == []


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rendering_without_facts_leaves_no_placeholder(rule) -> None:  # type: ignore[no-untyped-def]
    for text in (rule.message, rule.remedy):
        out = render_message(text, {}, {})
        assert "{" not in out.replace("{...}", "") and "[[" not in out and "]]" not in out
        assert "?:?" not in out and "(?)" not in out and ": ?" not in out


def test_segment_kept_only_with_all_its_fields() -> None:
    template = "listens on the address[[ ({host}:{port})]]; try check[[ --port {port}]]."
    assert (
        render_message(template, {"port": "8000"}, {})
        == "listens on the address; try check --port 8000."
    )
    assert (
        render_message(template, {"host": "0.0.0.0", "port": "8000"}, {})
        == "listens on the address (0.0.0.0:8000); try check --port 8000."
    )
    assert render_message(template, {}, {}) == "listens on the address; try check."


def test_groups_win_over_facts_and_empty_values_count_as_missing() -> None:
    assert render_message("a[[ {x}]]", {"x": "group"}, {"x": "fact"}) == "a group"
    assert render_message("a[[ {x}]]", {"x": ""}, {}) == "a"
    assert render_message("a[[ {x:g}]]", {}, {"x": 2.50}) == "a 2.5"
