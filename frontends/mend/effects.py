"""print, warnings.warn and logging calls deferred until after the graph.

A statement ``print(...)`` / ``warnings.warn(...)`` / ``<logger>.info(...)`` (a global logger or the
``logging`` module; ``debug``, ``info``, ``warning``, ``error``, ``critical``) becomes
``_mend_rt.deferred(key, *values)``. ``key`` names an :class:`~torchmux.frontends.mend.runtime.Effect`
holding what is constant (the callee as a global expression, constant arguments, keyword arguments,
the user's file, line and function); ``values`` are what must come out of the graph. f-strings and
``"..." % (...)`` are taken apart, and ``.item()``, ``.tolist()``, ``int()``, ``float()``, ``bool()`` and
shapes inside them are applied after the graph, so only tensors and constants leave it (which is what
Dynamo's ``reorderable_logging_functions`` accepts). Logged tensors are copied where the log was.
"""

from __future__ import annotations

import ast
import copy
import logging
import warnings
from typing import Any

from . import runtime as rt
from .analysis import Context, Purity, located, name_node, purity, rt_call

LOG_METHODS = set(rt._LEVELS)


def log_kind(call: ast.Call, ctx: Context) -> tuple[str, Any] | None:
    """("print" | "warn" | "log", details) if ``call`` is a print/warn/logging call we can defer."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    f = call.func
    if isinstance(f, ast.Name) and f.id == "print" and ctx.resolve(f) is print:
        if all(
            (k.arg in ("sep", "end", "flush") and isinstance(k.value, ast.Constant))
            or (k.arg == "file" and ctx.is_global_expr(k.value))
            for k in call.keywords
        ):
            return "print", None
        return None
    target = ctx.resolve(f)
    if target is warnings.warn:
        kw = {k.arg: k.value for k in call.keywords}
        if set(kw) - {"category", "stacklevel"} or len(call.args) > 2 or not call.args:
            return None
        if "stacklevel" in kw and not (isinstance(kw["stacklevel"], ast.Constant) and kw["stacklevel"].value == 1):
            return None
        category = call.args[1] if len(call.args) > 1 else kw.get("category")
        if category is not None and not isinstance(ctx.resolve(category), type):
            return None
        return "warn", category
    if isinstance(f, ast.Attribute) and f.attr in LOG_METHODS and not call.keywords and call.args:
        owner = ctx.resolve(f.value)
        if isinstance(owner, logging.Logger) or owner is logging:
            return "log", rt._LEVELS[f.attr]
    return None


class Args:
    """Splits a call's arguments into constant parts and the runtime values passed to ``deferred``."""

    def __init__(self, ctx: Context, converted: dict[str, str]) -> None:
        self.ctx, self.converted = ctx, converted
        self.values: list[ast.expr] = []

    def value(self, expr: ast.expr) -> tuple[Any, ...]:
        expr, converts = strip_conversions(expr, self.ctx)
        if isinstance(expr, ast.Name) and expr.id in self.converted:
            converts = (self.converted[expr.id],) + converts
        if _is_shape(expr):
            expr, converts = rt_call("size_in", expr), ("size",) + converts  # a torch.Size leaves the graph as a tensor
        self.values.append(expr)
        return ("value", len(self.values) - 1, converts)

    def part(self, expr: ast.expr) -> tuple[Any, ...]:
        if isinstance(expr, ast.Constant):
            return ("const", expr.value)
        if isinstance(expr, ast.JoinedStr):
            pieces: list[Any] = []
            for v in expr.values:
                if isinstance(v, ast.Constant):
                    pieces.append(str(v.value))
                else:
                    assert isinstance(v, ast.FormattedValue)
                    _, index, convert = self.value(v.value)
                    conv = chr(v.conversion) if v.conversion not in (-1, None) else ""
                    spec = self.part(v.format_spec) if v.format_spec is not None else None
                    pieces.append((index, convert, conv, spec))
            return ("fstring", tuple(pieces))
        if (
            isinstance(expr, ast.BinOp)
            and isinstance(expr.op, ast.Mod)
            and isinstance(expr.left, ast.Constant)
            and isinstance(expr.left.value, str)
        ):
            items = expr.right.elts if isinstance(expr.right, ast.Tuple) else [expr.right]
            return ("percent", expr.left.value, tuple(self.part(x) for x in items), isinstance(expr.right, ast.Tuple))
        return self.value(expr)


def strip_conversions(expr: ast.expr, ctx: Context) -> tuple[ast.expr, tuple[str, ...]]:
    """``int(t.item())`` -> (``t``, ("item", "int")): conversions to Python values, applied after the graph."""
    converts: list[str] = []
    while isinstance(expr, ast.Call) and not expr.keywords:
        f = expr.func
        if isinstance(f, ast.Attribute) and f.attr in ("item", "tolist") and not expr.args:
            converts.insert(0, f.attr)
            expr = f.value
        elif len(expr.args) == 1 and not isinstance(expr.args[0], ast.Starred) and ctx.resolve(f) in (int, float, bool):
            converts.insert(0, ctx.resolve(f).__name__)
            expr = expr.args[0]
        else:
            break
    return expr, tuple(converts)


def _is_shape(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Attribute) and expr.attr == "shape") or (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr == "size"
        and not expr.args
        and not expr.keywords
    )


def arg_purity(arg: ast.expr, ctx: Context, p: Purity) -> Purity:
    """Purity of a deferred log argument: its conversions (``.item()``, ``int()``) happen after the graph."""
    for leaf in log_leaves(arg):
        purity(strip_conversions(leaf, ctx)[0], ctx, p)
    return p


def defer(
    stmt: ast.Expr, ctx: Context, converted: dict[str, str], guard: tuple[str, int] | None = None
) -> ast.If | None:
    """``_mend_rt.deferred(key, ...)`` standing for the print/warn/log statement ``stmt``, or None."""
    call = stmt.value
    assert isinstance(call, ast.Call)
    kind = log_kind(call, ctx)
    if kind is None:
        return None
    what, detail = kind
    a = Args(ctx, converted)
    kwargs: tuple[tuple[str, Any], ...] = ()
    callee_expr = call.func
    if what == "warn":
        parts = (a.part(call.args[0]),) + ((("const", ctx.resolve(detail)),) if detail is not None else ())
    else:
        parts = tuple(a.part(x) for x in call.args)
        kwargs = tuple(
            (k.arg, k.value.value if isinstance(k.value, ast.Constant) else rt.Lazy(lazy(k.value, ctx)))
            for k in call.keywords
            if k.arg is not None
        )  # log_kind refused **kwargs
    values = a.values
    if guard is not None:
        values = [name_node(guard[0])] + values
        parts = tuple(shift(p) for p in parts)
    effect = rt.Effect(
        what,
        lazy(callee_expr, ctx),
        ctx.globals,
        ctx.filename,
        stmt.lineno,
        ctx.funcname,
        parts,
        kwargs,
        guarded=0 if guard is None else guard[1],
        level=detail if what == "log" else 0,
    )
    key = rt.register(effect)
    note = ctx.note(stmt, f"{ast.unparse(call.func)}(...) deferred until after the graph")
    return located(
        ast.If(rt_call("fired", ast.Constant(note)), [ast.Expr(rt_call("deferred", ast.Constant(key), *values))], []),
        stmt,
    )


def shift(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """Renumber a part's runtime values by one (a guard value goes first)."""
    if part[0] == "value":
        return ("value", part[1] + 1, part[2])
    if part[0] == "percent":
        return ("percent", part[1], tuple(shift(p) for p in part[2]), part[3])
    if part[0] == "fstring":
        return (
            "fstring",
            tuple(
                p if isinstance(p, str) else (p[0] + 1, p[1], p[2], None if p[3] is None else shift(p[3]))
                for p in part[1]
            ),
        )
    return part


def lazy(expr: ast.expr, ctx: Context) -> Any:
    """A function of the globals that evaluates the global expression ``expr`` when the effect is replayed."""
    code = compile(ast.Expression(ast.fix_missing_locations(copy.deepcopy(expr))), ctx.filename, "eval")
    return lambda g: eval(code, g)  # noqa: S307 - the user's own expression, in the user's own globals


def log_leaves(arg: ast.expr) -> list[ast.expr]:
    """The expressions a log argument formats (what ``_Args.part`` passes as runtime values)."""
    if isinstance(arg, ast.JoinedStr):
        return [x for v in arg.values if isinstance(v, ast.FormattedValue) for x in log_leaves(v.value)]
    if (
        isinstance(arg, ast.BinOp)
        and isinstance(arg.op, ast.Mod)
        and isinstance(arg.left, ast.Constant)
        and isinstance(arg.left.value, str)
    ):
        return [x for v in (arg.right.elts if isinstance(arg.right, ast.Tuple) else [arg.right]) for x in log_leaves(v)]
    return [arg]
