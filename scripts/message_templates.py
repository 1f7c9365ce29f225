"""Turn the raise/assert/logger calls of one Python module into message templates (by `ast`).

A template is the literal text a log shows, with `{name}` placeholders for f-string fields and
%-format or .format() arguments, literal braces doubled as in str.format. Messages built in a local
variable (`msg = f"..."; raise ValueError(msg)`) are followed to their last assignment. logging
%-formats only when given arguments, so a call without them keeps `%%` as the log prints it.
Used by scripts/vllm_catalogue.py; never imports the code it reads.
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

LOG_LEVELS = frozenset(
    {
        "info",
        "warning",
        "warn",
        "error",
        "exception",
        "critical",
        "fatal",
        "info_once",
        "warning_once",
        "error_once",
    }
)
_LOGGER = re.compile(r"(?:^|\.)_?(?:logger|log|LOGGER)$")
_PERCENT = re.compile(
    r"%(?:\((?P<key>\w+)\))?(?P<flags>[-#0 +]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?[hlL]?(?P<conv>[diouxXeEfFgGcrsa%])"
)
MAX_DEPTH = 4
# Calls that only format a value: the placeholder is named after the value.
_FORMATTERS = frozenset({"format_gib", "GiB", "str", "int", "float", "round", "repr", "abs"})


@dataclass(slots=True)
class Found:
    """One message in one file of one version."""

    template: str
    kind: str  # raise | log
    type: str  # exception class or log method
    line: int


def _esc(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _label(node: ast.expr) -> str:
    """A short placeholder name for the expression a message interpolates."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _label(node.value)
        return node.attr if base in ("self", "cls", "value") else f"{base}.{node.attr}"
    if isinstance(node, ast.Call):
        func = _label(node.func)
        if func in _FORMATTERS and len(node.args) == 1:
            return _label(node.args[0])
        return func + "()"
    if isinstance(node, ast.Subscript):
        index = node.slice
        shown = repr(index.value) if isinstance(index, ast.Constant) else ""
        return f"{_label(node.value)}[{shown}]"
    if isinstance(node, ast.BinOp):
        return _label(node.left)
    if isinstance(node, ast.Constant):
        return type(node.value).__name__
    return "value"


def _placeholder(node: ast.expr, spec: str = "", conv: str = "") -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float):
        try:
            shown = repr(node.value) if conv == "r" else format(node.value, spec)
        except (ValueError, TypeError):
            shown = str(node.value)
        return _esc(shown)
    name = _label(node)[-60:].lstrip(".")
    return "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"


class Scope:
    """Assignments to plain names in one function, so `raise X(msg)` can find what msg was."""

    def __init__(self, body: ast.AST | None) -> None:
        self.assigned: dict[str, list[tuple[int, ast.expr]]] = {}
        if body is None:
            return
        for node in ast.walk(body):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                target = node.target
                value = ast.BinOp(left=target, op=ast.Add(), right=node.value)
                ast.copy_location(value, node)
            else:
                continue
            if isinstance(target, ast.Name):
                self.assigned.setdefault(target.id, []).append((node.lineno, value))

    def single(self, name: str) -> bool:
        return len(self.assigned.get(name, ())) == 1

    def lookup(self, name: str, before: int) -> ast.expr | None:
        earlier = [(n, v) for n, v in self.assigned.get(name, ()) if n < before]
        return max(earlier, key=lambda item: item[0])[1] if earlier else None


def template(node: ast.expr, scope: Scope, depth: int = 0) -> str | None:
    """The message an expression builds, as a str.format-style template; None when unreadable."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(node, ast.Constant):
        return _esc(node.value) if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return _joined(node, scope, depth)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = template(node.left, scope, depth + 1)
        right = template(node.right, scope, depth + 1)
        if left is None and right is None:
            return None
        return (left if left is not None else _placeholder(node.left)) + (
            right if right is not None else _placeholder(node.right)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        text = template(node.left, scope, depth + 1)
        if text is None:
            return None
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        return percent(text, args)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        base = node.func.value
        if isinstance(base, ast.Constant) and isinstance(base.value, str):
            return _brace_format(base.value, node)
        return None
    if isinstance(node, ast.Name):
        value = scope.lookup(node.id, getattr(node, "lineno", 1 << 30))
        return None if value is None else template(value, scope, depth + 1)
    return None


def _joined(node: ast.JoinedStr, scope: Scope, depth: int) -> str:
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(_esc(str(value.value)))
        elif (
            isinstance(value, ast.FormattedValue)
            and isinstance(value.value, ast.Name)
            and scope.single(value.value.id)
            and value.format_spec is None
            and value.conversion == -1
            and (inner := template(value.value, scope, depth + 1)) is not None
            and inner.count(" ") >= 3
        ):
            # f"{msg} (original error: {e})" with msg = "Failed to load model - ...": the text of msg.
            # Only a sentence assigned once: a short value (backend = "trtllm") or one of several
            # branches (suggestion = "..." in an if and an else) is not the message's text.
            parts.append(inner)
        elif isinstance(value, ast.FormattedValue):
            spec = ""
            if isinstance(value.format_spec, ast.JoinedStr) and all(
                isinstance(v, ast.Constant) for v in value.format_spec.values
            ):
                spec = "".join(str(v.value) for v in value.format_spec.values)  # type: ignore[attr-defined]
            conv = {114: "r", 115: "", 97: "a"}.get(value.conversion, "")
            parts.append(_placeholder(value.value, spec, conv))
    return "".join(parts)


def percent(text: str, args: Sequence[ast.expr]) -> str:
    """Apply printf-style directives to a template, as logging does when it has arguments."""
    queue = list(args)
    keyed: dict[str, ast.expr] = {}
    if len(args) == 1 and isinstance(args[0], ast.Dict):
        keyed = {
            k.value: v
            for k, v in zip(args[0].keys, args[0].values, strict=False)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }

    def sub(m: re.Match[str]) -> str:
        conv = m.group("conv")
        if conv == "%":
            return "%"
        node: ast.expr | None = keyed.get(m.group("key") or "") if m.group("key") else None
        if node is None and not m.group("key"):
            node = queue.pop(0) if queue else None
        spec = ""
        if conv in "dioxXeEfFgG":
            prec = f".{m.group('prec')}" if m.group("prec") not in (None, "*") else ""
            spec = prec + ("d" if conv in "diu" else conv)
        if node is None:
            return "{" + (m.group("key") or "arg") + "}"
        return _placeholder(node, spec, "r" if conv == "r" else "")

    # Directives live only in the literal parts, never inside a placeholder.
    pieces = re.split(r"(\{\{|\}\}|\{[^{}]*\})", text)
    return "".join(
        p if p.startswith("{") or p.startswith("}") else _PERCENT.sub(sub, p) for p in pieces
    )


def _brace_format(raw: str, call: ast.Call) -> str | None:
    """`"...{}...".format(args)` as a template whose fields name the arguments."""
    keyed = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    auto = 0
    parts = []
    try:
        parsed = list(string.Formatter().parse(raw))
    except ValueError:
        return None
    for literal, field_name, spec, conv in parsed:
        parts.append(_esc(literal))
        if field_name is None:
            continue
        node: ast.expr | None
        if field_name == "":
            node = call.args[auto] if auto < len(call.args) else None
            auto += 1
        elif field_name.isdigit():
            i = int(field_name)
            node = call.args[i] if i < len(call.args) else None
        else:
            node = keyed.get(field_name.split(".")[0].split("[")[0])
        spec = spec or ""
        if node is None:
            parts.append("{" + (field_name or "arg") + "}")
        else:
            parts.append(_placeholder(node, spec if "{" not in spec else "", conv or ""))
    return "".join(parts)


def _type_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _functions(tree: ast.Module) -> Iterator[tuple[ast.AST, Scope]]:
    yield tree, Scope(None)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node, Scope(node)


def _direct(body: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one function, not descending into nested functions (they are scanned on their own)."""
    stack = list(ast.iter_child_nodes(body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def extract(source: str) -> list[Found]:
    """Every readable raise/assert/log message in one module's source text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[Found] = []
    for body, scope in _functions(tree):
        for node in _direct(body):
            hit = _message(node, scope)
            if hit is not None and hit.template.strip():
                found.append(hit)
    return sorted(found, key=lambda f: f.line)


def _message(node: ast.AST, scope: Scope) -> Found | None:
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
        name = _type_name(node.exc)
        text = template(node.exc.args[0], scope)
        if name and text is not None:
            return Found(text, "raise", name, node.lineno)
    elif isinstance(node, ast.Assert) and node.msg is not None:
        text = template(node.msg, scope)
        if text is not None:
            return Found(text, "raise", "AssertionError", node.lineno)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LOG_LEVELS
        and node.args
        and _LOGGER.search(ast.unparse(node.func.value))
    ):
        text = template(node.args[0], scope)
        if text is None:
            return None
        # logging only %-formats when given arguments: "50%%" stays literal without them.
        if len(node.args) > 1:
            text = percent(text, node.args[1:])
        return Found(text, "log", node.func.attr, node.lineno)
    return None
