"""Loops whose trip count is tensor data -> ``torch.while_loop``.

- ``while <tensor test>:`` (:meth:`LoopRules.while_convert`) becomes ``runtime.loop``;
- ``for _ in range(n)`` with ``n`` read from tensor data (``.item()``/``.tolist()`` in its expression, or
  in the assignment of a name in it) and the loop variable never read (:meth:`LoopRules.range_convert`)
  becomes ``runtime.repeat``, a ``while_loop`` with a counter.

The body must only assign side-effect-free values to names bound before the loop (ifs inside are
lowered as in :mod:`.branches`). At run time the loop is ``torch.while_loop`` when every carried value
is a tensor that needs no gradient, the Python loop otherwise. A trip count known in Python is left to
Dynamo, which unrolls it.
"""

from __future__ import annotations

import ast

from .analysis import TYPE_PARAMS, Context, Purity, exact_items, located, name_node, names_stored, plain_target, purity, rt_call
from .items import reads_item


class LoopRules:
    """The loop rules, mixed into :class:`~.statements.Block`."""

    ctx: Context
    loads: dict[str, int]
    from_data: set[str]

    def loop_body(self, body: list[ast.stmt], pure: Purity, defined: set[str]) -> list[str] | None:
        """The names a loop body carries, if it only assigns side-effect-free values to names bound before
        the loop (or holds ifs that ``nested_ok`` lowers) and draws no random numbers; else None."""
        bound = set(defined)
        for st in body:
            if isinstance(st, ast.Pass):
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and plain_target(st.targets[0]):
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
                               [], None, **TYPE_PARAMS)

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
        if not (reads_item(n) or any(isinstance(x, ast.Name) and x.id in self.from_data for x in ast.walk(n))):
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
        test_fn = ast.FunctionDef(f"_mend_wtest{k}", params, [ast.Return(exact_items(s.test))], [], None, **TYPE_PARAMS)
        body_fn = self.body_fn(f"_mend_wbody{k}", s.body, carried, k)
        run = ast.Assign([ast.Tuple([name_node(x, True) for x in carried], ast.Store())],
                         rt_call("loop", ast.Constant(note), name_node(test_fn.name), name_node(body_fn.name),
                                 ast.Tuple([name_node(x) for x in carried], ast.Load())))
        return located([test_fn, body_fn, run], s)
