"""The statement walker: applies every rule module to one function's body.

``rewrite(fdef, ctx)`` rewrites the ``ast.FunctionDef`` of a user function in place and returns how
many rewrites it applied (``ctx.notes``: which, where). :class:`Block` visits statement lists in order,
tracking the names surely bound so far, and hands each statement to the rule that claims it
(:mod:`.checks`, :mod:`.branches`, :mod:`.loops`, :mod:`.effects`; :mod:`.items` runs first, over the
whole function). The pipeline and the list of rules are described once, in :mod:`.pipeline`.
"""

from __future__ import annotations

import ast
import copy

from . import runtime as rt
from .analysis import (
    Context,
    data_sized_names,
    fired_stmt,
    loaded_names,
    located,
    maybe_tensor_test,
    name_node,
    names_stored,
    rt_call,
)
from .attrs import attribute_dicts
from .branches import BranchRules
from .checks import CheckRules
from .effects import defer
from .expressions import conditional_expressions
from .items import drawn_range, item_for_logging, numpy_grids, reads_item, size_products
from .legacy import data_reads, legacy_variables
from .loops import LoopRules


def rewrite(fdef: ast.FunctionDef, ctx: Context) -> int:
    """Apply every rule to ``fdef`` in place; return how many rewrites fired (``ctx.notes`` lists them)."""
    a = fdef.args
    params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
    declared_global = {n for s in ast.walk(fdef) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
    ctx.locals = (set(params) | names_stored(fdef.body)) - declared_global
    ctx.data_sized = data_sized_names(fdef)
    loads: dict[str, int] = {}
    for n in loaded_names(fdef):
        loads[n.id] = loads.get(n.id, 0) + 1
    block = Block(ctx, loads)
    block.from_data = {
        t.id
        for st in ast.walk(fdef)
        if isinstance(st, ast.Assign) and reads_item(st.value)
        for t in st.targets
        if isinstance(t, ast.Name)
    }
    attribute_dicts(fdef, ctx)
    legacy_variables(fdef, ctx)
    if ctx.export:
        data_reads(fdef, ctx)
    conditional_expressions(fdef, ctx)
    size_products(fdef, ctx)
    numpy_grids(fdef, ctx)
    block.converted = item_for_logging(fdef, ctx, block)
    fdef.body = block.stmts(fdef.body, set(params), top=True)
    return len(ctx.notes)


class Block(CheckRules, BranchRules, LoopRules):
    """Rewrites statement lists; ``defined`` holds the names surely bound so far."""

    def __init__(self, ctx: Context, loads: dict[str, int]) -> None:
        self.ctx, self.loads = ctx, loads
        self.converted: dict[str, str] = {}
        self.unused_items: dict[int, bool] = {}
        self.item_notes: dict[int, int] = {}
        self.from_data: set[str] = set()  # names assigned from an expression that reads .item()

    def stmts(self, body: list[ast.stmt], defined: set[str], top: bool = False) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, s in enumerate(body):
            rest = body[i + 1 :]
            if (
                isinstance(s, ast.If)
                and not s.orelse
                and s.body
                and isinstance(s.body[-1], ast.Return)
                and rest
                and isinstance(rest[-1], ast.Return)
                and maybe_tensor_test(s.test, self.ctx)
            ):
                whole = ast.copy_location(ast.If(s.test, s.body, rest), s)
                new = self.if_convert(whole, defined, early=True)
                if new is not None:
                    return out + new
            if top:
                new = self.check(s, rest)
                if new is not None:
                    out += new
                    continue
            out += self.stmt(s, defined)
            defined |= bound_by(s)
        return out

    def stmt(self, s: ast.stmt, defined: set[str]) -> list[ast.stmt]:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            deferred = self.defer(s)
            return [deferred] if deferred is not None else [s]
        if isinstance(s, ast.Assign) and id(s) in self.item_notes:
            kept: list[ast.stmt] = [s, fired_stmt(self.item_notes[id(s)], s)]
            if self.unused_items.get(id(s)):
                key = rt.register(
                    rt.Effect(
                        "item",
                        None,
                        self.ctx.globals,
                        self.ctx.filename,
                        s.lineno,
                        self.ctx.funcname,
                        (("value", 0, ()),),
                    )
                )
                check = located(ast.Expr(rt_call("deferred", ast.Constant(key), copy.deepcopy(s.targets[0]))), s)
                check.value.args[1].ctx = ast.Load()
                kept.append(check)
            return kept
        if isinstance(s, ast.Assign):
            drawn = drawn_range(s, self.ctx)
            if drawn is not None:
                return drawn
        if isinstance(s, ast.If):
            if maybe_tensor_test(s.test, self.ctx):
                new = self.if_convert(s, defined)
                if new is not None:
                    return new
            s.body = self.stmts(s.body, set(defined))
            s.orelse = self.stmts(s.orelse, set(defined))
            return [s]
        if isinstance(s, ast.For):
            new = self.range_convert(s, defined)
            if new is None:
                new = self.break_convert(s, defined)
            if new is not None:
                return new
        if isinstance(s, (ast.For, ast.AsyncFor)):
            s.body = self.stmts(s.body, set(defined) | names_stored([ast.Assign([s.target], ast.Constant(0))]))
            s.orelse = self.stmts(s.orelse, set(defined))
        elif isinstance(s, ast.While):
            if maybe_tensor_test(s.test, self.ctx):
                new = self.while_convert(s, defined)
                if new is not None:
                    return new
            s.body = self.stmts(s.body, set(defined))
            s.orelse = self.stmts(s.orelse, set(defined))
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            s.body = self.stmts(s.body, defined)
        elif isinstance(s, ast.Try):
            s.body = self.stmts(s.body, set(defined))
            for h in s.handlers:
                h.body = self.stmts(h.body, set(defined))
            s.orelse = self.stmts(s.orelse, set(defined))
            s.finalbody = self.stmts(s.finalbody, set(defined))
        return [s]

    def defer(self, s: ast.Expr, guard: tuple[str, int] | None = None) -> ast.stmt | None:
        new = defer(s, self.ctx, self.converted, guard)
        if new is not None:  # logged tensors are copied where the log was: later code may change them in place
            first = new.body[0]
            assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)  # the deferred(...) call
            call = first.value
            skip = 2 if guard is not None else 1
            call.args[skip:] = [located(rt_call("snap", v), s) for v in call.args[skip:]]
        return new

    def branch(
        self, body: list[ast.stmt], prefix: str, outputs: list[str], guard: tuple[str, int]
    ) -> tuple[list[ast.stmt], list[str]]:
        """The branch's statements with every name it binds renamed (so both branches can run), and its outputs."""
        renames: dict[str, str] = {}
        out: list[ast.stmt] = []
        pending = [copy.deepcopy(st) for st in body]
        while pending:
            st = pending.pop(0)
            if isinstance(st, ast.If):  # validated by nested_ok: lowered to assignments, renamed below
                pending[:0] = self.lower(st)
                continue
            if isinstance(st, ast.Pass):
                continue
            if isinstance(st, ast.Expr):
                reads: ast.AST = st
            else:  # besides logs (and ifs, lowered above) the rules let only assignments and a valued return through
                assert isinstance(st, (ast.Assign, ast.Return)) and st.value is not None
                value = reads = st.value
            for n in ast.walk(reads):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in renames:
                    n.id = renames[n.id]
            if isinstance(st, ast.Return):
                renames["_mend_ret"] = prefix + "ret"
                out.append(located(ast.Assign([name_node(prefix + "ret", True)], value), st))
            elif isinstance(st, ast.Assign):
                for n in ast.walk(st.targets[0]):
                    if isinstance(n, ast.Name):
                        renames[n.id] = prefix + n.id
                        n.id = prefix + n.id
                out.append(st)
            else:
                assert isinstance(st, ast.Expr)  # a log (the rules let nothing else through)
                new = self.defer(st, guard)
                assert new is not None
                out.append(new)
        return out, [renames.get(x, x) for x in outputs]


def bound_by(s: ast.stmt) -> set[str]:
    if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return names_stored([s])
    return set()
