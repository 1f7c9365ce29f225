"""The formats each command offers are declared once (`output.formats.FORMATS`): its `--format`
choices are those, and its renderer registry has one renderer per declared format, each with the
signature of the command's renderer Protocol. A format declared for a command that has no
renderer for it fails here."""

from __future__ import annotations

import importlib
import inspect
import typing
from types import ModuleType

import click
import pytest

from vllm_offload_doctor.cli import cli
from vllm_offload_doctor.output.formats import FORMATS, OutputFormat

# Where each command's renderers live: a command added to FORMATS must be named here too.
REGISTRIES = {
    "analyze": "vllm_offload_doctor.analyze.render",
    "check": "vllm_offload_doctor.checks.render",
    "compare": "vllm_offload_doctor.compare.render",
    "inspect": "vllm_offload_doctor.inspect.render",
    "rules": "vllm_offload_doctor.analyze.rules_render",
}


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)  # type: ignore[attr-defined]
    assert command is not None, name
    return command


def _format_option(name: str) -> click.Choice:
    option = next(p for p in _command(name).params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    return option.type


def test_every_command_with_a_format_option_is_declared() -> None:
    names = cli.list_commands(click.Context(cli))  # type: ignore[attr-defined]
    with_format = {n for n in names if any(p.name == "fmt" for p in _command(n).params)}
    assert with_format == set(FORMATS) == set(REGISTRIES)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_format_choices_are_the_declared_formats(name: str) -> None:
    choices = [OutputFormat(c) for c in _format_option(name).choices]
    assert choices == list(FORMATS[name])
    assert choices[0] is OutputFormat.TEXT  # the default comes first


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_declared_format_has_a_renderer(name: str) -> None:
    registry = importlib.import_module(REGISTRIES[name]).RENDERERS
    missing = set(FORMATS[name]) - set(registry)
    assert not missing, f"{name} declares {sorted(missing)} but has no renderer for it"
    assert list(registry) == list(FORMATS[name])  # and renders nothing it does not offer


def _protocol(module: ModuleType) -> type:
    """The renderer Protocol a registry is typed with: dict[OutputFormat, Protocol]."""
    hints = typing.get_type_hints(module)
    key, value = typing.get_args(hints["RENDERERS"])
    assert key is OutputFormat
    return typing.cast(type, value)


def _params(fn: object, drop_self: bool = False) -> list[tuple[str, object, object]]:
    params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    if drop_self:
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("name", sorted(set(FORMATS) - {"analyze"}))
def test_each_renderer_has_its_commands_signature(name: str) -> None:
    module = importlib.import_module(REGISTRIES[name])
    protocol = _protocol(module)
    assert getattr(protocol, "_is_protocol", False), protocol
    want = _params(protocol.__call__, drop_self=True)  # type: ignore[operator]
    for fmt, render in module.RENDERERS.items():
        assert _params(render) == want, f"{name} {fmt}: {render.__name__}"


def test_each_analyze_format_has_the_item_and_end_signatures() -> None:
    module = importlib.import_module(REGISTRIES["analyze"])
    hints = typing.get_type_hints(module.Format)
    for fmt, form in module.RENDERERS.items():
        assert form.item is not None or form.end is not None, fmt  # it prints something
        for part in ("item", "end"):
            fn = getattr(form, part)
            if fn is None:
                continue
            protocol = next(a for a in typing.get_args(hints[part]) if a is not type(None))
            want = _params(protocol.__call__, drop_self=True)
            assert len(_params(fn)) == len(want), (fmt, part)  # all passed by position
