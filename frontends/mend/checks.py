"""``if <tensor>: raise E(msg)``, ``if not <tensor>: raise``, ``assert <tensor>, msg``: checked after the graph.

At the top of a function whose remaining statements have no side effect, draw no random numbers and
cannot raise on some data (:func:`pure_stmts`), the check becomes a deferred effect (:mod:`.runtime`'s
``deferred``) that raises ``E(msg)`` after the graph, with the user's file and line in a note. Later
deferred prints do not appear when it fails. ``assert`` stays under ``__debug__``. While
``torch.export`` traces the mended code, the check is ``torch._check`` on the test's value instead (a
runtime assertion in the exported program: :func:`.runtime._export_check`).
"""

from __future__ import annotations

import ast
import copy

from . import runtime as rt
from .analysis import (
    Context,
    Purity,
    Walker,
    exact_items,
    fired_stmt,
    guard_test,
    located,
    maybe_tensor_test,
    name_node,
    plain_target,
    purity,
    rt_call,
)
from .effects import Args, arg_purity, lazy, log_kind, shift


class CheckRules(Walker):
    """The check rule, mixed into :class:`~.statements.Block`."""

    def check(self, s: ast.stmt, rest: list[ast.stmt]) -> list[ast.stmt] | None:
        exc: ast.expr  # the exception class (or whatever the user wrote there)
        if isinstance(s, ast.Assert):
            test, raise_if, exc, args = s.test, False, ast.Name("AssertionError", ast.Load()), [s.msg] if s.msg else []
        elif (
            isinstance(s, ast.If)
            and not s.orelse
            and len(s.body) == 1
            and isinstance(s.body[0], ast.Raise)
            and s.body[0].cause is None
            and s.body[0].exc is not None
        ):
            test, raise_if = s.test, True
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, raise_if = test.operand, False
            exc = s.body[0].exc
            args = []
            if isinstance(exc, ast.Call):
                if exc.keywords or any(isinstance(x, ast.Starred) for x in exc.args):
                    return None
                args = list(exc.args)
                exc = exc.func
        else:
            return None
        if not maybe_tensor_test(test, self.ctx) or not isinstance(self.ctx.resolve(exc), type):
            return None
        pure = Purity()
        for x in args:
            arg_purity(x, self.ctx, pure)
        pure_stmts(rest, self.ctx, pure)
        if not pure.ok or pure.random or pure.may_fail:
            return None  # the rest would run before the check raises: it must not draw numbers or raise
        c = self.ctx.fresh("c")
        a = Args(self.ctx, self.converted)
        parts = (("value", 0, ()),) + tuple(shift(a.part(x)) for x in args)
        key = rt.register(
            rt.Effect(
                "check",
                lazy(exc, self.ctx),
                self.ctx.globals,
                self.ctx.filename,
                s.lineno,
                self.ctx.funcname,
                parts,
                extra={"raise_if": raise_if},
            )
        )
        what = "assert" if isinstance(s, ast.Assert) else f"raise {ast.unparse(exc)}"
        note = self.ctx.note(s, f"{what} on a tensor -> checked after the graph")
        deferred = ast.Expr(rt_call("deferred", ast.Constant(key), name_node(c), *a.values))
        original = copy.deepcopy(s)
        if isinstance(original, ast.Assert):
            original.test = name_node(c)
        else:
            original.test = name_node(c) if raise_if else ast.UnaryOp(ast.Not(), name_node(c))
        new: list[ast.stmt] = [
            ast.Assign([name_node(c, True)], exact_items(test)),
            ast.If(guard_test(c, pure), [fired_stmt(note, s), deferred], [original]),
        ]
        if isinstance(s, ast.Assert):
            new = [ast.If(name_node("__debug__"), new, [])]
        return located(new, s)


def pure_stmts(body: list[ast.stmt], ctx: Context, pure: Purity) -> None:
    """Accumulate in ``pure`` whether running ``body`` has an effect besides binding local names."""
    for st in body:
        if not pure.ok:
            return
        if isinstance(st, ast.Pass):
            continue
        if isinstance(st, ast.Return):
            if st.value is not None:
                purity(st.value, ctx, pure)
        elif isinstance(st, ast.Assign) and len(st.targets) == 1 and plain_target(st.targets[0]):
            purity(st.value, ctx, pure)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and log_kind(st.value, ctx):
            for x in st.value.args:
                arg_purity(x, ctx, pure)
        elif isinstance(st, ast.Assert):
            purity(st.test, ctx, pure)
            if st.msg is not None:
                purity(st.msg, ctx, pure)
        elif isinstance(st, ast.If):
            purity(st.test, ctx, pure)
            if (
                len(st.body) == 1
                and isinstance(st.body[0], ast.Raise)
                and isinstance(st.body[0].exc, ast.Call)
                and isinstance(ctx.resolve(st.body[0].exc.func), type)
            ):
                for x in st.body[0].exc.args:
                    arg_purity(x, ctx, pure)
                pure_stmts(st.orelse, ctx, pure)
            else:
                pure_stmts(st.body, ctx, pure)
                pure_stmts(st.orelse, ctx, pure)
        elif (
            isinstance(st, ast.For)
            and isinstance(st.target, ast.Name)
            and isinstance(st.iter, ast.Call)
            and ctx.resolve(st.iter.func) is range
            and not st.orelse
        ):
            for x in st.iter.args:
                purity(x, ctx, pure)
            pure_stmts(st.body, ctx, pure)
        else:
            pure.fail()
