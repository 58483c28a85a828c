"""Loops whose trip count is tensor data -> ``torch.while_loop``.

- ``while <tensor test>:`` (:meth:`LoopRules.while_convert`) becomes ``runtime.loop``;
- ``for _ in range(n)`` with ``n`` read from tensor data (``.item()``/``.tolist()`` in its expression, or
  in the assignment of a name in it) and the loop variable never read (:meth:`LoopRules.range_convert`)
  becomes ``runtime.repeat``, a ``while_loop`` with a counter;
- ``for layer in self.layers: x = layer(x); if <tensor test>: break`` (:meth:`LoopRules.break_convert`;
  also ``for _ in range(n)``, and statements after the break test, whose values count only when the
  test did not hold: ``runtime.after_break``) keeps iterating with the values frozen once the test was true (``runtime.until``: a running "stopped"
  flag and ``torch.where``), so the whole loop is one graph; it needs every layer to be a side-effect
  free module (checked at run time, ``runtime.maskable``) and values that merge (same shape, dtype and
  device; values needing gradients too: the old and new values are both computed, see ``runtime.mergeable``).

The body must only assign side-effect-free values to names bound before the loop (ifs inside are
lowered as in :mod:`.branches`). At run time the loop is ``torch.while_loop`` when every carried value
is a tensor that needs no gradient (``runtime.loopable``), the user's loop as written otherwise. A
trip count known in Python is left to Dynamo, which unrolls it.
"""

from __future__ import annotations

import ast
import copy

from .analysis import (
    TYPE_PARAMS,
    Purity,
    Walker,
    exact_items,
    loaded_names,
    located,
    maybe_tensor_test,
    name_node,
    names_stored,
    plain_target,
    purity,
    rt_call,
)
from .items import reads_item


class LoopRules(Walker):
    """The loop rules, mixed into :class:`~.statements.Block`."""

    def break_convert(self, s: ast.For, defined: set[str]) -> list[ast.stmt] | None:
        """``for t in <names>: <assignments>; if <tensor test>: break`` -> a masked loop (module docstring)."""
        if s.orelse or not isinstance(s.target, ast.Name) or len(s.body) < 2:
            return None
        at = [
            i
            for i, st in enumerate(s.body)
            if isinstance(st, ast.If) and not st.orelse and len(st.body) == 1 and isinstance(st.body[0], ast.Break)
        ]
        if len(at) != 1 or at[0] == 0:
            return None
        body, last, after = s.body[: at[0]], s.body[at[0]], s.body[at[0] + 1 :]
        if not (isinstance(last, ast.If) and maybe_tensor_test(last.test, self.ctx)):
            return None
        it = s.iter
        while isinstance(it, ast.Attribute):
            it = it.value
        if not (isinstance(it, ast.Name) or self._constant_range(s.iter)):
            return None  # the iterable is read twice (checked, then looped over): names, attributes, range(n)
        target = s.target.id
        inside: dict[str, int] = {}
        for n in loaded_names(s):
            inside[n.id] = inside.get(n.id, 0) + 1
        pure = Purity()
        self.ctx.module_names = {target}
        try:
            for st in body + after:
                if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and plain_target(st.targets[0])):
                    return None
                purity(st.value, self.ctx, pure)
            purity(exact_items(last.test), self.ctx, pure)
        finally:
            self.ctx.module_names = set()
        stored = names_stored(body + after)
        carried = sorted(stored & defined)
        if not pure.ok or pure.random or pure.may_fail or not carried:
            return None
        if any(self.loads.get(n, 0) > inside.get(n, 0) for n in (stored - defined) | {target}):
            return None  # a name of one iteration is read after the loop: its value would be the last one's
        k = self.ctx.counter = self.ctx.counter + 1
        note = self.ctx.note(s, "for with 'if <tensor>: break' -> masked loop (torch.where)")
        flag, state = f"_mend_m{k}", f"_mend_s{k}"
        test = f"_mend_bt{k}"
        at_break = [f"_mend_bv{k}_{x}" for x in carried] if after else []  # the values where the test is
        stmts, outs = self.branch(
            body
            + [ast.Assign([name_node(test, True)], exact_items(last.test))]
            + [ast.Assign([name_node(v, True)], name_node(x)) for v, x in zip(at_break, carried)]
            + after,
            f"_mend_b{k}_",
            carried + [test] + at_break,
            (f"_mend_b{k}", 1),
        )
        new_values: ast.expr = ast.Tuple([name_node(x) for x in outs[: len(carried)]], ast.Load())
        if after:  # the test held: the values at the test; else those at the end of the body
            new_values = rt_call(
                "after_break",
                name_node(outs[len(carried)]),
                ast.Tuple([name_node(x) for x in outs[len(carried) + 1 :]], ast.Load()),
                new_values,
            )
        mods = [m for m in pure.modules if not (isinstance(m, ast.Name) and m.id == target)]
        calls_target = any(isinstance(m, ast.Name) and m.id == target for m in pure.modules)
        check = ast.Assign(
            [name_node(flag, True)],
            rt_call("maskable", copy.deepcopy(s.iter), ast.Constant(calls_target), *[copy.deepcopy(m) for m in mods]),
        )
        step = ast.Assign(
            [
                ast.Tuple(
                    [ast.Tuple([name_node(x, True) for x in carried], ast.Store()), name_node(state, True)], ast.Store()
                )
            ],
            rt_call(
                "until",
                ast.Constant(note),
                name_node(flag),
                name_node(state),
                ast.Tuple([name_node(x) for x in carried], ast.Load()),
                new_values,
                name_node(outs[len(carried)]),
            ),
        )
        stop = ast.If(rt_call("stopped", name_node(state)), [ast.Break()], [])
        loop = ast.For(s.target, s.iter, stmts + [step, stop], [], None)
        original = copy.deepcopy(s)  # run as written when masking cannot apply: no break is added
        original.body = self.stmts(original.body, set(defined) | {target})
        return located(
            [
                check,
                ast.If(name_node(flag), [ast.Assign([name_node(state, True)], ast.Constant(None)), loop], [original]),
            ],
            s,
        )

    def _constant_range(self, it: ast.expr) -> bool:
        """``range(...)`` of names and constants: evaluating it twice is the same."""
        return (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and self.ctx.resolve(it.func) is range
            and not it.keywords
            and all(isinstance(a, (ast.Constant, ast.Name)) for a in it.args)
        )

    def loop_body(self, body: list[ast.stmt], pure: Purity, defined: set[str]) -> list[str] | None:
        """The names a loop body carries, if it only assigns side-effect-free values to names bound before
        the loop (or holds ifs that ``nested_ok`` lowers) and draws no random numbers; else None."""
        if not self.straight_body(body, pure, defined):
            return None
        carried = sorted(names_stored(body))
        if not pure.ok or pure.random or pure.modules or not carried or not set(carried) <= defined:
            return None  # self.<module> calls are not checked inside a loop body: left alone
        return carried

    def body_fn(self, name: str, body: list[ast.stmt], carried: list[str], k: int) -> ast.FunctionDef:
        params = ast.arguments([], [ast.arg(n) for n in carried], None, [], [], None, [])
        stmts, outs = self.branch(body, f"_mend_l{k}_", carried, (f"_mend_l{k}", 1))
        return ast.FunctionDef(
            name,
            params,
            stmts + [ast.Return(ast.Tuple([name_node(x) for x in outs], ast.Load()))],
            [],
            None,
            **TYPE_PARAMS,
        )

    def range_convert(self, s: ast.For, defined: set[str]) -> list[ast.stmt] | None:
        """``for i in range(n):`` with ``n`` read from tensor data (``.item()`` in its expression or in
        the assignment of a name in it), ``i`` never read and a body as ``loop_body`` accepts becomes
        ``_mend_rt.repeat``: ``torch.while_loop`` with a counter."""
        it = s.iter
        if (
            s.orelse
            or not isinstance(s.target, ast.Name)
            or self.loads.get(s.target.id, 0)
            or not isinstance(it, ast.Call)
            or self.ctx.resolve(it.func) is not range
            or len(it.args) != 1
            or it.keywords
            or isinstance(it.args[0], ast.Starred)
        ):
            return None
        n = it.args[0]
        if not (reads_item(n) or any(isinstance(x, ast.Name) and x.id in self.from_data for x in ast.walk(n))):
            return None  # a trip count known in Python: Dynamo unrolls the loop, as it should
        carried = self.loop_body(s.body, Purity(), defined)
        if carried is None:
            return None
        k = self.ctx.counter = self.ctx.counter + 1
        note = self.ctx.note(s, "for over range(<tensor data>) -> torch.while_loop")
        fn = self.body_fn(f"_mend_rbody{k}", s.body, carried, k)
        count = f"_mend_n{k}"
        run = ast.Assign(
            [ast.Tuple([name_node(x, True) for x in carried], ast.Store())],
            rt_call(
                "repeat",
                ast.Constant(note),
                name_node(count),
                name_node(fn.name),
                ast.Tuple([name_node(x) for x in carried], ast.Load()),
            ),
        )
        original = copy.deepcopy(s)  # the user's loop, run where while_loop cannot be (no break is added)
        assert isinstance(original.iter, ast.Call)  # a copy of `it`
        original.iter.args[0] = name_node(count)
        original.body = self.stmts(original.body, set(defined) | {s.target.id})
        test = rt_call(
            "loopable",
            ast.Tuple([name_node(x) for x in carried], ast.Load()),
            ast.Tuple([ast.Constant(True) for _ in carried], ast.Load()),
            name_node(count),
        )
        return located([fn, ast.Assign([name_node(count, True)], it.args[0]), ast.If(test, [run], [original])], s)

    def while_convert(self, s: ast.While, defined: set[str]) -> list[ast.stmt] | None:
        """``while <tensor test>:`` whose body only assigns side-effect-free values to names already bound
        (or holds ifs that ``nested_ok`` lowers) becomes ``_mend_rt.loop``: ``torch.while_loop`` in the
        graph, the same loop in Python where that cannot be."""
        if s.orelse:
            return None
        inside: dict[str, int] = {}  # reads inside the loop as written (before `i += 1` reads i below)
        for n in loaded_names(s):
            inside[n.id] = inside.get(n.id, 0) + 1
        body = [_as_assign(st) for st in s.body]  # `i += 1` is `i = i + 1` for a name (ints, tensors: no in-place)
        carried = self.loop_body(body, purity(exact_items(s.test), self.ctx, Purity()), defined)
        if carried is None:
            return None
        k = self.ctx.counter = self.ctx.counter + 1
        note = self.ctx.note(s, "while on a tensor -> torch.while_loop")
        params = ast.arguments([], [ast.arg(n) for n in carried], None, [], [], None, [])
        test_fn = ast.FunctionDef(f"_mend_wtest{k}", params, [ast.Return(exact_items(s.test))], [], None, **TYPE_PARAMS)
        body_fn = self.body_fn(f"_mend_wbody{k}", body, carried, k)
        read_after = ast.Tuple([ast.Constant(self.loads.get(x, 0) > inside.get(x, 0)) for x in carried], ast.Load())
        run = ast.Assign(
            [ast.Tuple([name_node(x, True) for x in carried], ast.Store())],
            rt_call(
                "loop",
                ast.Constant(note),
                name_node(test_fn.name),
                name_node(body_fn.name),
                ast.Tuple([name_node(x) for x in carried], ast.Load()),
            ),
        )
        original = copy.deepcopy(s)  # the user's loop, run where while_loop cannot be (no break is added)
        original.body = self.stmts(original.body, set(defined))
        test = rt_call("loopable", ast.Tuple([name_node(x) for x in carried], ast.Load()), read_after)
        return located([test_fn, body_fn, ast.If(test, [run], [original])], s)


def _as_assign(st: ast.stmt) -> ast.stmt:
    """``name op= value`` as ``name = name op value``; other statements unchanged. Only used where the loop
    rule then accepts the statement, which it does only when every carried value is an int or a tensor
    needing no gradient (for a tensor, ``+=`` in place and ``+`` give the same values)."""
    if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
        value = ast.BinOp(name_node(st.target.id), st.op, st.value)
        return ast.copy_location(ast.Assign([name_node(st.target.id, True)], ast.copy_location(value, st)), st)
    return st
