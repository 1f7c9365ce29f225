"""What the README and CONTRIBUTING.md say is true: paths, recipes, commands, outputs, exit codes."""

from __future__ import annotations

import re
import shlex
import sys
import time
import types
from pathlib import Path

import click
import pytest
from fake_probe import FakeProbe
from script_loader import load_script

from vllm_offload_doctor import checks
from vllm_offload_doctor.checks import Options, Status, run_checks
from vllm_offload_doctor.checks import registry as check_registry

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_every_repo_path_the_docs_name_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    paths = set(re.findall(r"`((?:rules|fixtures|tests|scripts|bench)/[^`<\s]+)`", text))
    if doc == "README.md":
        assert "fixtures/h200-compare/needs-offload-README.md" in paths
    assert paths
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []


def test_readme_shows_compare_for_a_model_that_does_not_fit() -> None:
    section = README.split("## `offload-doctor compare`", 1)[1].split(
        "## `offload-doctor analyze", 1
    )[0]
    for words in ("needs offload", "--verify-fix", "`ignored`", "`effective`", "needs-offload"):
        assert words in section, words
    # the fake-vllm recipe uses scenarios the fake knows
    fake = (ROOT / "tests" / "fake-vllm").read_text()
    for scenario in set(re.findall(r"FAKE_VLLM_SCENARIO=([\w-]+)", section)):
        assert f"    {scenario}" in fake, scenario


def test_where_things_live_names_files_that_exist() -> None:
    table = CONTRIBUTING.split("### Where things live", 1)[1].split("###", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    # the header, then a rule, a fact, a check, an output format, a compare measurement
    assert len(rows) == 6
    paths = set(re.findall(r"`((?:rules|fixtures|tests|vllm_offload_doctor)/[^`<]+)`", table))
    modules = set(re.findall(r"`(\w+)\.\w+`", table))  # `facts.FactCollector`, `render.py`
    assert paths and modules
    for path in paths:
        assert (ROOT / path).exists(), path
    package = ROOT / "vllm_offload_doctor"
    for module in modules:
        assert (package / f"{module}.py").exists() or (package / module).is_dir(), module


def test_the_check_template_joins_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fill the README's check template in, add it to MODULES: it runs, in that place."""
    block = CONTRIBUTING.split("**A check.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = (
        block.replace("<id>", "example")
        .replace("<Title>", "Example")
        .replace("<name>", "example")
        .replace("if ... else", "if ctx.options.port == 8000 else")
    )
    name = "vllm_offload_doctor.checks.example"
    module = types.ModuleType(name)
    module.__file__ = f"<README: {name}>"
    monkeypatch.setitem(sys.modules, name, module)
    checks.all_checks()  # the real checks register now, not into the copy below
    monkeypatch.setattr(check_registry, "REGISTERED", list(check_registry.REGISTERED))
    checks.all_checks.cache_clear()
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    monkeypatch.setattr(checks, "MODULES", (*checks.MODULES[:-1], "example", checks.MODULES[-1]))
    try:
        results = run_checks(FakeProbe(), Options()).checks
    finally:
        checks.all_checks.cache_clear()
    assert [c.id for c in results][-2:] == ["example", "env"]
    example = results[-2]
    assert example.status is Status.OK and example.title == "Example"
    assert module.__doc__ and "check --list -v" in module.__doc__


# --- the commands, their outputs and exit codes ----------------------------------------------


def test_readme_outputs_are_what_the_cli_prints() -> None:
    """Each sample output is regenerated (the CLI run, the H200 reports rendered) and compared."""
    from vllm_offload_doctor.inspect.procs import RealSource, find_servers

    outputs = load_script("readme_outputs")
    blocks = outputs.BLOCK.findall(README)
    kinds = {spec.split()[0] for _, spec, _, _ in blocks}
    assert kinds == {"run", "compare", "capture"}, kinds
    # inspect's sample is the machine with no server. Another test's fake vLLM may run beside
    # this one: that block is tried again, and excused only if a server ran at its last try.
    stale: list[str] = []
    for _, spec, shown, _ in blocks:
        fresh = outputs.body(spec)
        if fresh != shown and spec.startswith("run inspect"):
            for _try in range(5):
                time.sleep(1)
                busy = bool(find_servers(RealSource()))
                fresh = outputs.body(spec)
                busy = busy or bool(find_servers(RealSource()))
                if fresh == shown or not busy:
                    break
            if fresh != shown and busy:
                continue  # another test's server stood in the way
        if fresh != shown:
            stale.append(spec)
    assert not stale, (
        f"README's sample outputs are stale ({stale}): "
        "run `python scripts/readme_outputs.py --write README.md`"
    )


def _readme_commands() -> list[list[str]]:
    """Every `offload-doctor ...` invocation in the README's shell blocks, as argv."""
    found = []
    for kind, block in re.findall(r"```(bash|console)\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if kind == "console":  # a transcript: only the prompt lines are commands
                if not line.startswith("$ "):
                    continue
                line = line.removeprefix("$ ")
            if "offload-doctor " not in line or line.lstrip().startswith("#"):
                continue
            words = shlex.split(line.split("offload-doctor ", 1)[1], comments=True)
            cut = [i for i, w in enumerate(words) if w in ("|", "&&", ">", ";")]
            found.append(words[: cut[0]] if cut else words)
    return found


# Placeholders the README spells in capitals, and a value of their kind to parse with.
PLACEHOLDERS = {"MODEL_DIR": "model-dir", "VLLM_PYTHON": sys.executable, "PID": "1"}


def _parse(argv: list[str]) -> None:
    from vllm_offload_doctor.cli import cli

    argv = [PLACEHOLDERS.get(w, w) for w in argv]
    # -o checks its folder at once: the example's folder is the reader's, not this machine's.
    argv = [
        "report.out" if i and argv[i - 1] in ("-o", "--output") else w for i, w in enumerate(argv)
    ]
    ctx = click.Context(cli)
    if argv[0].startswith("-"):  # the group's own: --help, --version
        assert argv[0] in {o for p in cli.get_params(ctx) for o in p.opts}, argv
        return
    command = cli.get_command(ctx, argv[0])
    assert command is not None, f"no command {argv[0]!r}"
    command.make_context(argv[0], argv[1:], parent=ctx)


def test_every_command_the_readme_shows_parses() -> None:
    """Options that exist, values they accept: what the README shows, click takes."""
    commands = _readme_commands()
    assert {c[0] for c in commands} >= {"check", "compare", "analyze", "inspect", "rules"}
    for argv in commands:
        try:
            _parse(argv)
        except click.ClickException as exc:
            pytest.fail(f"README: offload-doctor {shlex.join(argv)}: {exc.format_message()}")


def test_every_help_example_parses() -> None:
    from vllm_offload_doctor.cli import cli

    ctx = click.Context(cli)
    assert isinstance(cli, click.Group)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None and command.help
        for line in command.help.split("Examples:", 1)[1].splitlines():
            if "offload-doctor " in line and "$(" not in line:
                words = shlex.split(line.split("offload-doctor ", 1)[1], comments=True)
                cut = [i for i, w in enumerate(words) if w in ("|", "&&", ">")]
                argv = words[: cut[0]] if cut else words
                try:
                    _parse([PLACEHOLDERS.get(w, w) for w in argv])
                except click.ClickException as exc:
                    pytest.fail(f"{name} --help: {line.strip()}: {exc.format_message()}")


def test_readme_exit_codes_are_exitcodes_py() -> None:
    from vllm_offload_doctor import exitcodes

    table = README.split("<!-- exit-codes:start -->", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    defined = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert documented == defined
    # The samples' exit statuses are codes the table explains.
    shown = {int(n) for n in re.findall(r"^\$ echo \$\?\n(\d+)$", README, re.M)}
    assert shown and shown <= documented


def test_help_exit_statuses_are_documented() -> None:
    from vllm_offload_doctor.cli import cli

    table = README.split("<!-- exit-codes:start -->", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    ctx = click.Context(cli)
    for name in ("check", "compare", "analyze", "inspect"):
        command = cli.get_command(ctx, name)
        assert command is not None and command.help
        said = command.help.split("Exit", 1)[1].split("Examples:", 1)[0]
        codes = {
            int(n) for n in re.findall(r"\b(\d{1,3})\b", said) if int(n) in (0, 1, 2, 3, 130, 143)
        }
        assert codes and codes <= documented, name


def test_the_first_command_exits_as_the_readme_says() -> None:
    """ "(exit 1 = a failure was diagnosed)": the shipped log's sample transcript ends in 1."""
    assert "(exit 1 = a failure was diagnosed)" in README
    sample = README.split(
        "<!-- output: run analyze fixtures/logs/offload-ignored-v2-0.25.1.log -->"
    )[1]
    assert sample.split("<!-- /output -->")[0].rstrip().endswith("$ echo $?\n1\n```")


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest" in README
    assert "pip install -c .ci/constraints.txt -e '.[test]' && python -m pytest\n" in ci


def test_folders_give_the_suffixes_the_readme_and_help_name(tmp_path: Path) -> None:
    """One description of the folder walk, and never a file collected only to be refused."""
    from vllm_offload_doctor.analyze import logread
    from vllm_offload_doctor.cli import cli

    plain = [s for s in logread.LOG_SUFFIXES if s != ".zst"]
    listed = "`, `".join(f"*{s}" for s in plain[:-1]) + f"` and `*{plain[-1]}`"
    assert f"(every `{listed} under it;\n`*.zst` too on Python 3.14+)" in README
    command = cli.get_command(click.Context(cli), "analyze")
    assert command is not None and command.help
    assert " ".join(command.help.split()).count(", ".join(f"*{s}" for s in plain[:-1])) == 1
    (tmp_path / "server.log.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    sources, errors = logread.resolve_inputs([str(tmp_path)])
    if logread.COMPRESSED_SUFFIXES[-1] == ".zst":
        assert [s.name for s in sources] == [str(tmp_path / "server.log.zst")]
    else:
        assert sources == [] and errors == [
            f"{tmp_path}: directory holds no log files ({logread.FOLDER_GLOBS})"
        ]
