"""One place each: links in `links.py` (rules spell shared ones the same way), SCHEMA_VERSION in `formats.py`."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from vllm_offload_doctor import links

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"https://[^\s\"'<>)]+")
KNOWN = {v for k, v in vars(links).items() if k.isupper() and isinstance(v, str)}
PENDING: set[str] = set()


def _urls(path: Path) -> list[str]:
    return [
        u for u in URL.findall(path.read_text()) if "{" not in u and "\\" not in u and "@" not in u
    ]


def test_links_in_more_than_one_rule_are_the_shared_ones() -> None:
    counts = Counter(u for rule in ROOT.glob("rules/*.toml") for u in set(_urls(rule)))
    shared = {u for u, n in counts.items() if n > 1}
    assert shared, "no link is shared by two rules: the test reads the wrong folder"
    assert shared <= KNOWN, f"add {sorted(shared - KNOWN)} to links.py"


def test_rules_spell_a_registered_page_as_links_py_does() -> None:
    """gpu.html and gpu/ are the same page twice: one spelling, the one in links.py."""

    def page(u: str) -> str:
        return u.removesuffix("/").removesuffix(".html")

    pages = {page(u): u for u in KNOWN}
    for rule in ROOT.glob("rules/*.toml"):
        for u in _urls(rule):
            if page(u) in pages:
                assert u == pages[page(u)], f"{rule.name}: {u} is links.py's {pages[page(u)]}"


def test_code_writes_no_link_out() -> None:
    package = ROOT / "vllm_offload_doctor"
    offenders = [
        f"{path.relative_to(package)}: {u}"
        for path in package.rglob("*.py")
        if path.name != "links.py" and path.name not in PENDING
        for u in _urls(path)
    ]
    assert offenders == []


def test_one_schema_version() -> None:
    """check json, analyze json/jsonl and report.json share formats.SCHEMA_VERSION."""
    package = ROOT / "vllm_offload_doctor"
    defined = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name not in PENDING and re.search(r"^SCHEMA_VERSION\s*=", path.read_text(), re.M)
    ]
    assert defined == ["output/formats.py"]
