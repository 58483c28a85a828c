"""The mend pass over one function: rules 2-5 here, rule 1 in :mod:`torchmux.frontends.mend_effects`.

``rewrite(fdef, ctx)`` rewrites the ``ast.FunctionDef`` of a user function in place and returns how
many rewrites it applied (``ctx.notes``: which, where). The new code calls helpers from
:mod:`torchmux.frontends._mend_runtime`, reachable as the free variable ``_mend_rt``.

1. **Deferred effects.** ``print``, ``warnings.warn`` and logging calls as statements are replayed
   after the graph with the user's text, file and line (see ``mend_effects``).
2. **.item()/.tolist() for logging.** ``m = t.item()`` where ``m`` is only logged (or never used)
   keeps ``m`` a tensor; the conversion happens when the log is replayed.
3. **Checks.** ``if c: raise E(msg)`` / ``if not c: raise E(msg)`` / ``assert c, msg`` at the top of a
   function whose remaining statements have no side effect, draw no random numbers and cannot raise
   on some data become a check that raises ``E(msg)`` after the graph (later deferred prints do not
   appear when it fails).
4. **Tensor if/else.** An ``if`` whose branches only assign pure expressions to names, log, or return
   one value, including an early ``if c: return a`` followed by the rest of the function, becomes
   ``torch.where`` (both branches run) when neither branch draws random numbers or can raise on some
   data and nothing needs gradients; otherwise ``torch.cond`` (only the taken branch runs). An ``if``
   nested in a branch (``elif`` included) whose branches only assign side-effect-free values is
   lowered first: both of its branches run and ``_mend_rt.pick`` selects. In a test, ``not t`` stays
   a tensor and a float ``.item()`` compared (or added, subtracted, multiplied, then compared) stays in
   the graph as float64, which gives exactly Python's answer (``mend_analysis.exact_items``).
5. **Tensor while.** ``while <tensor test>:`` whose body only assigns side-effect-free values to names
   bound before the loop (ifs inside lowered as in rule 4) becomes ``_mend_rt.loop``:
   ``torch.while_loop`` when every carried value is a tensor needing no gradient, the Python loop
   otherwise.

Every rewrite keeps the user's statements behind a guard decided while Dynamo traces: when the test
is not a one-element tensor, or a ``self.<module>`` call is not a known side-effect-free module, the
original code runs. Nothing is rewritten that cannot be shown safe from the source: unknown calls,
attribute or item stores, in-place methods, loops and other statements in branches, and nested
functions are left as written.
"""

from __future__ import annotations

import ast
import copy
import sys
from typing import Any

from . import _mend_runtime as rt
from .mend_analysis import (Context, Purity, exact_items, guard_test, loaded_names, located, maybe_tensor_test,
                            name_node, names_stored, purity, rt_call)
from .mend_effects import Args, arg_purity, defer, lazy, log_kind, log_leaves, shift, strip_conversions

_TYPE_PARAMS: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}


def rewrite(fdef: ast.FunctionDef, ctx: Context) -> int:
    """Apply every rule to ``fdef`` in place; return how many rewrites fired (``ctx.notes`` lists them)."""
    a = fdef.args
    params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
    declared_global = {n for s in ast.walk(fdef) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
    ctx.locals = (set(params) | names_stored(fdef.body)) - declared_global
    loads: dict[str, int] = {}
    for n in loaded_names(fdef):
        loads[n.id] = loads.get(n.id, 0) + 1
    block = _Block(ctx, loads)
    block.from_data = {t.id for st in ast.walk(fdef) if isinstance(st, ast.Assign) and _reads_item(st.value)
                       for t in st.targets if isinstance(t, ast.Name)}
    block.converted = _item_for_logging(fdef, ctx, block)
    fdef.body = block.stmts(fdef.body, set(params), top=True)
    return len(ctx.notes)


def _own_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements ``_Block`` visits: nested in if/for/while/with/try, not in functions, classes or match."""
    out: list[ast.stmt] = []
    for s in body:
        out.append(s)
        if isinstance(s, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            for field_name in ("body", "orelse", "finalbody"):
                out += _own_statements(getattr(s, field_name, []))
            for h in getattr(s, "handlers", []):
                out += _own_statements(h.body)
    return out


def _item_for_logging(fdef: ast.FunctionDef, ctx: Context, block: _Block) -> dict[str, str]:
    """Rule 2: ``m = t.item()`` where ``m`` is only logged (or unused) keeps ``m`` a tensor."""
    nodes = _own_statements(fdef.body)
    log_args: set[int] = set()  # ids of the Name nodes that are arguments of deferrable logs
    for n in nodes:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and log_kind(n.value, ctx) is not None:
            for arg in n.value.args:
                leaves = [strip_conversions(x, ctx)[0] for x in log_leaves(arg)]
                log_args.update(id(x) for x in leaves if isinstance(x, ast.Name))
    stores: dict[str, int] = {}
    for n in ast.walk(fdef):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            stores[n.id] = stores.get(n.id, 0) + 1
    converted: dict[str, str] = {}
    for n in nodes:
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
            continue
        v, name = n.value, n.targets[0].id
        if not (isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in ("item", "tolist")
                and not v.args and not v.keywords) or stores.get(name) != 1:
            continue
        uses = [x for x in loaded_names(fdef) if x.id == name]
        if all(id(x) in log_args for x in uses):
            converted[name] = v.func.attr  # applied before the log's own conversions
            n.value = v.func.value
            block.unused_items[id(n)] = not uses and v.func.attr == "item"
            block.item_notes[id(n)] = ctx.note(
                n, f".{v.func.attr}() of '{name}' kept as a tensor (only " + ("logged)" if uses else "computed, never used)"))
    return converted


class _Block:
    """Rewrites statement lists (rules 1, 3 and 4); ``defined`` holds the names surely bound so far."""

    def __init__(self, ctx: Context, loads: dict[str, int]) -> None:
        self.ctx, self.loads = ctx, loads
        self.converted: dict[str, str] = {}
        self.unused_items: dict[int, bool] = {}
        self.item_notes: dict[int, int] = {}
        self.from_data: set[str] = set()  # names assigned from an expression that reads .item()

    def stmts(self, body: list[ast.stmt], defined: set[str], top: bool = False) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, s in enumerate(body):
            rest = body[i + 1:]
            if (isinstance(s, ast.If) and not s.orelse and s.body and isinstance(s.body[-1], ast.Return)
                    and rest and isinstance(rest[-1], ast.Return) and maybe_tensor_test(s.test, self.ctx)):
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
            defined |= _bound_by(s)
        return out

    def stmt(self, s: ast.stmt, defined: set[str]) -> list[ast.stmt]:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            new = self.defer(s)
            return [new] if new is not None else [s]
        if isinstance(s, ast.Assign) and id(s) in self.item_notes:
            new: list[ast.stmt] = [s, _fired(self.item_notes[id(s)], s)]
            if self.unused_items.get(id(s)):
                key = rt.register(rt.Effect("item", None, self.ctx.globals, self.ctx.filename, s.lineno,
                                            self.ctx.funcname, (("value", 0, ()),)))
                check = located(ast.Expr(rt_call("deferred", ast.Constant(key), copy.deepcopy(s.targets[0]))), s)
                check.value.args[1].ctx = ast.Load()
                new.append(check)
            return new
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
            call = new.body[0].value
            skip = 2 if guard is not None else 1
            call.args[skip:] = [located(rt_call("snap", v), s) for v in call.args[skip:]]
        return new

    # --- rule 3: checks ---------------------------------------------------------------------------

    def check(self, s: ast.stmt, rest: list[ast.stmt]) -> list[ast.stmt] | None:
        if isinstance(s, ast.Assert):
            test, raise_if, exc, args = s.test, False, ast.Name("AssertionError", ast.Load()), [s.msg] if s.msg else []
        elif (isinstance(s, ast.If) and not s.orelse and len(s.body) == 1 and isinstance(s.body[0], ast.Raise)
              and s.body[0].cause is None and s.body[0].exc is not None):
            test, raise_if = s.test, True
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, raise_if = test.operand, False
            exc = s.body[0].exc
            args = []
            if isinstance(exc, ast.Call):
                if exc.keywords or any(isinstance(x, ast.Starred) for x in exc.args):
                    return None
                exc, args = exc.func, list(exc.args)
        else:
            return None
        if not maybe_tensor_test(test, self.ctx) or not isinstance(self.ctx.resolve(exc), type):
            return None
        pure = Purity()
        for x in args:
            arg_purity(x, self.ctx, pure)
        _pure_stmts(rest, self.ctx, pure)
        if not pure.ok or pure.random or pure.may_fail:
            return None  # the rest would run before the check raises: it must not draw numbers or raise
        c = self.ctx.fresh("c")
        a = Args(self.ctx, self.converted)
        parts = (("value", 0, ()),) + tuple(shift(a.part(x)) for x in args)
        key = rt.register(rt.Effect("check", lazy(exc, self.ctx), self.ctx.globals, self.ctx.filename, s.lineno,
                                    self.ctx.funcname, parts, extra={"raise_if": raise_if}))
        what = "assert" if isinstance(s, ast.Assert) else f"raise {ast.unparse(exc)}"
        note = self.ctx.note(s, f"{what} on a tensor -> checked after the graph")
        deferred = ast.Expr(rt_call("deferred", ast.Constant(key), name_node(c), *a.values))
        original = copy.deepcopy(s)
        if isinstance(original, ast.Assert):
            original.test = name_node(c)
        else:
            original.test = name_node(c) if raise_if else ast.UnaryOp(ast.Not(), name_node(c))
        new: list[ast.stmt] = [ast.Assign([name_node(c, True)], exact_items(test)),
                               ast.If(guard_test(c, pure), [_fired(note, s), deferred], [original])]
        if isinstance(s, ast.Assert):
            new = [ast.If(name_node("__debug__"), new, [])]
        return located(new, s)

    # --- rule 4: tensor if/else -------------------------------------------------------------------

    def if_convert(self, s: ast.If, defined: set[str], early: bool = False) -> list[ast.stmt] | None:
        T, F = s.body, s.orelse
        returns = bool(T) and isinstance(T[-1], ast.Return)
        if returns != (bool(F) and isinstance(F[-1], ast.Return)):
            return None
        pure = Purity()
        logs = False
        for branch in (T, F):
            bound = set(defined)
            for j, st in enumerate(branch):
                if isinstance(st, ast.Pass):
                    continue
                if isinstance(st, ast.Return) and j == len(branch) - 1 and st.value is not None:
                    purity(st.value, self.ctx, pure)
                elif isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain_target(st.targets[0]):
                    purity(st.value, self.ctx, pure)
                    bound |= names_stored([st])
                elif isinstance(st, ast.If) and self.nested_ok(st, pure, bound):
                    bound |= names_stored([st])
                elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and log_kind(st.value, self.ctx):
                    logs = True
                    for x in st.value.args:
                        arg_purity(x, self.ctx, pure)
                else:
                    return None
        speculate = not (pure.random or pure.may_fail)  # may both branches run? else only torch.cond
        if not pure.ok or (logs and not speculate):
            return None
        if returns:
            outputs = ["_mend_ret"]
        else:
            st_t, st_f = names_stored(T), names_stored(F)
            outputs = []
            inside = {}
            for n in loaded_names(s):
                inside[n.id] = inside.get(n.id, 0) + 1
            for n in sorted(st_t | st_f):
                if n in st_t and n in st_f or n in defined:
                    outputs.append(n)
                elif self.loads.get(n, 0) > inside.get(n, 0):
                    return None  # bound on one side only and read later: the rewrite could not keep it unbound
            if not outputs:
                return None
        p = self.ctx.fresh("p")
        k = self.ctx.counter
        t_body, t_outs = self.branch(T, f"_mend_t{k}_", outputs, (p, 1))
        f_body, f_outs = self.branch(F, f"_mend_f{k}_", outputs, (p, -1))
        tt = ast.Tuple([name_node(x) for x in t_outs], ast.Load())
        ff = ast.Tuple([name_node(x) for x in f_outs], ast.Load())

        def assign(value: ast.expr) -> ast.stmt:
            if returns:
                return ast.Return(ast.Subscript(value, ast.Constant(0), ast.Load()))
            return ast.Assign([ast.Tuple([name_node(x, True) for x in outputs], ast.Store())], value)

        fns: list[ast.stmt] = []
        if not logs:
            for name, body, outs in ((f"_mend_tfn{k}", t_body, tt), (f"_mend_ffn{k}", f_body, ff)):
                fns.append(ast.FunctionDef(name, ast.arguments([], [], None, [], [], None, []),
                                           copy.deepcopy(body) + [ast.Return(copy.deepcopy(outs))], [], None,
                                           **_TYPE_PARAMS))
            early_txt = "early return " if early else ""
            use_cond = [_fired(self.ctx.note(s, f"{early_txt}if on a tensor -> torch.cond"), s),
                        assign(rt_call("cond", name_node(p), name_node(f"_mend_tfn{k}"), name_node(f"_mend_ffn{k}")))]
        select = [assign(ast.IfExp(name_node(p), copy.deepcopy(tt), copy.deepcopy(ff)))]
        if not speculate:
            fast = fns + use_cond
        else:
            fallback = ast.If(rt_call("cond_ok", name_node(p), copy.deepcopy(tt), copy.deepcopy(ff)), fns + use_cond, select) \
                if not logs else select[0]
            where = self.ctx.note(s, ("early return " if early else "") + "if on a tensor -> torch.where")
            fast = t_body + f_body + [ast.If(rt_call("mergeable", name_node(p), tt, ff),
                                             [_fired(where, s), assign(rt_call("merge", name_node(p), copy.deepcopy(tt), copy.deepcopy(ff)))],
                                             [fallback])]
        original = ast.If(name_node(p), self.stmts(copy.deepcopy(T), set(defined)), self.stmts(copy.deepcopy(F), set(defined)))
        new = [ast.Assign([name_node(p, True)], exact_items(s.test)), ast.If(guard_test(p, pure), fast, [original])]
        return located(new, s)

    def nested_ok(self, s: ast.If, pure: Purity, bound: set[str]) -> bool:
        """Whether an ``if`` inside a branch can be lowered (``lower``): a tensor test, branches that only
        assign side-effect-free values to names (or hold such ifs), nothing that draws random numbers or
        can raise on some data (both nested branches will run), and every name bound on one side only
        already bound before (the other side keeps its value). Adds the ``self.<module>`` calls to check
        at run time to ``pure``."""
        if not maybe_tensor_test(s.test, self.ctx):
            return False
        inner = purity(exact_items(s.test), self.ctx, Purity())
        for branch in (s.body, s.orelse):
            b = set(bound)
            for st in branch:
                if isinstance(st, ast.Pass):
                    continue
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain_target(st.targets[0]):
                    purity(st.value, self.ctx, inner)
                elif not (isinstance(st, ast.If) and self.nested_ok(st, inner, b)):
                    return False
                b |= names_stored([st])
        if not inner.ok or inner.random or inner.may_fail:
            return False
        if (names_stored(s.body) ^ names_stored(s.orelse)) - bound:
            return False
        pure.modules += inner.modules
        return True

    def lower(self, s: ast.If) -> list[ast.stmt]:
        """A nested tensor if (``nested_ok``) as plain assignments: the test, both branches under fresh
        names, then ``x, y = _mend_rt.pick(test, (xt, yt), (xf, yf))`` (a select in the graph)."""
        outputs = sorted(names_stored(s.body) | names_stored(s.orelse))
        q = self.ctx.fresh("q")
        k = self.ctx.counter
        t_body, t_outs = self.branch(s.body, f"_mend_nt{k}_", outputs, (q, 1))
        f_body, f_outs = self.branch(s.orelse, f"_mend_nf{k}_", outputs, (q, -1))
        note = self.ctx.note(s, "nested if on a tensor -> torch.where")
        pick = rt_call("pick", ast.Constant(note), name_node(q), ast.Tuple([name_node(x) for x in t_outs], ast.Load()),
                       ast.Tuple([name_node(x) for x in f_outs], ast.Load()))
        new = [ast.Assign([name_node(q, True)], exact_items(s.test)), *t_body, *f_body,
               ast.Assign([ast.Tuple([name_node(x, True) for x in outputs], ast.Store())], pick)]
        return located(new, s)

    # --- rule 5: while on a tensor test ---------------------------------------------------------------

    def loop_body(self, body: list[ast.stmt], pure: Purity, defined: set[str]) -> list[str] | None:
        """The names a loop body carries, if it only assigns side-effect-free values to names bound before
        the loop (or holds ifs that ``nested_ok`` lowers) and draws no random numbers; else None."""
        bound = set(defined)
        for st in body:
            if isinstance(st, ast.Pass):
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain_target(st.targets[0]):
                purity(st.value, self.ctx, pure)
            elif not (isinstance(st, ast.If) and self.nested_ok(st, pure, bound)):
                return None
            bound |= names_stored([st])
        carried = sorted(names_stored(body))
        if not pure.ok or pure.random or pure.modules or not carried or not set(carried) <= defined:
            return None  # self.<module> calls are not checked inside a loop body: left alone
        return carried

    def body_fn(self, name: str, body: list[ast.stmt], carried: list[str], k: int) -> ast.FunctionDef:
        params = ast.arguments([], [ast.arg(n) for n in carried], None, [], [], None, [])
        stmts, outs = self.branch(body, f"_mend_l{k}_", carried, (f"_mend_l{k}", 1))
        return ast.FunctionDef(name, params, stmts + [ast.Return(ast.Tuple([name_node(x) for x in outs], ast.Load()))],
                               [], None, **_TYPE_PARAMS)

    def range_convert(self, s: ast.For, defined: set[str]) -> list[ast.stmt] | None:
        """``for i in range(n):`` with ``n`` read from tensor data (``.item()`` in its expression or in
        the assignment of a name in it), ``i`` never read and a body as ``loop_body`` accepts becomes
        ``_mend_rt.repeat``: ``torch.while_loop`` with a counter."""
        it = s.iter
        if (s.orelse or not isinstance(s.target, ast.Name) or self.loads.get(s.target.id, 0)
                or not isinstance(it, ast.Call) or self.ctx.resolve(it.func) is not range
                or len(it.args) != 1 or it.keywords or isinstance(it.args[0], ast.Starred)):
            return None
        n = it.args[0]
        if not (_reads_item(n) or any(isinstance(x, ast.Name) and x.id in self.from_data for x in ast.walk(n))):
            return None  # a trip count known in Python: Dynamo unrolls the loop, as it should
        carried = self.loop_body(s.body, Purity(), defined)
        if carried is None:
            return None
        k = self.ctx.counter = self.ctx.counter + 1
        note = self.ctx.note(s, "for over range(<tensor data>) -> torch.while_loop")
        fn = self.body_fn(f"_mend_rbody{k}", s.body, carried, k)
        run = ast.Assign([ast.Tuple([name_node(x, True) for x in carried], ast.Store())],
                         rt_call("repeat", ast.Constant(note), it.args[0], name_node(fn.name),
                                 ast.Tuple([name_node(x) for x in carried], ast.Load())))
        return located([fn, run], s)

    def while_convert(self, s: ast.While, defined: set[str]) -> list[ast.stmt] | None:
        """``while <tensor test>:`` whose body only assigns side-effect-free values to names already bound
        (or holds ifs that ``nested_ok`` lowers) becomes ``_mend_rt.loop``: ``torch.while_loop`` in the
        graph, the same loop in Python where that cannot be."""
        if s.orelse:
            return None
        carried = self.loop_body(s.body, purity(exact_items(s.test), self.ctx, Purity()), defined)
        if carried is None:
            return None
        k = self.ctx.counter = self.ctx.counter + 1
        note = self.ctx.note(s, "while on a tensor -> torch.while_loop")
        params = ast.arguments([], [ast.arg(n) for n in carried], None, [], [], None, [])
        test_fn = ast.FunctionDef(f"_mend_wtest{k}", params, [ast.Return(exact_items(s.test))], [], None, **_TYPE_PARAMS)
        body_fn = self.body_fn(f"_mend_wbody{k}", s.body, carried, k)
        run = ast.Assign([ast.Tuple([name_node(x, True) for x in carried], ast.Store())],
                         rt_call("loop", ast.Constant(note), name_node(test_fn.name), name_node(body_fn.name),
                                 ast.Tuple([name_node(x) for x in carried], ast.Load())))
        return located([test_fn, body_fn, run], s)

    def branch(self, body: list[ast.stmt], prefix: str, outputs: list[str], guard: tuple[str, int]) -> tuple[list[ast.stmt], list[str]]:
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
            value_holder = st
            for n in ast.walk(value_holder.value if not isinstance(st, ast.Expr) else st):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in renames:
                    n.id = renames[n.id]
            if isinstance(st, ast.Return):
                renames["_mend_ret"] = prefix + "ret"
                out.append(located(ast.Assign([name_node(prefix + "ret", True)], st.value), st))
            elif isinstance(st, ast.Assign):
                for n in ast.walk(st.targets[0]):
                    if isinstance(n, ast.Name):
                        renames[n.id] = prefix + n.id
                        n.id = prefix + n.id
                out.append(st)
            else:
                new = self.defer(st, guard)
                assert new is not None
                out.append(new)
        return out, [renames.get(x, x) for x in outputs]


def _reads_item(e: ast.AST) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("item", "tolist")
               for c in ast.walk(e))


def _fired(note: int, at: ast.AST) -> ast.stmt:
    return located(ast.Expr(rt_call("fired", ast.Constant(note))), at)


def _plain_target(t: ast.expr) -> bool:
    if isinstance(t, ast.Name):
        return True
    return isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts)


def _bound_by(s: ast.stmt) -> set[str]:
    if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return names_stored([s])
    return set()


def _pure_stmts(body: list[ast.stmt], ctx: Context, pure: Purity) -> None:
    """Accumulate in ``pure`` whether running ``body`` has an effect besides binding local names."""
    for st in body:
        if not pure.ok:
            return
        if isinstance(st, ast.Pass):
            continue
        if isinstance(st, ast.Return):
            if st.value is not None:
                purity(st.value, ctx, pure)
        elif isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain_target(st.targets[0]):
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
            if len(st.body) == 1 and isinstance(st.body[0], ast.Raise) and isinstance(st.body[0].exc, ast.Call) \
                    and isinstance(ctx.resolve(st.body[0].exc.func), type):
                for x in st.body[0].exc.args:
                    arg_purity(x, ctx, pure)
                _pure_stmts(st.orelse, ctx, pure)
            else:
                _pure_stmts(st.body, ctx, pure)
                _pure_stmts(st.orelse, ctx, pure)
        elif (isinstance(st, ast.For) and isinstance(st.target, ast.Name) and isinstance(st.iter, ast.Call)
              and ctx.resolve(st.iter.func) is range and not st.orelse):
            for x in st.iter.args:
                purity(x, ctx, pure)
            _pure_stmts(st.body, ctx, pure)
        else:
            pure.fail()
