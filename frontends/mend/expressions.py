"""``a if <tensor test> else b`` (also inside comprehensions) -> ``torch.where``.

Runs over the whole function before the statement rules: in the value of every assignment and
``return``, a conditional expression whose test may be a tensor and whose two sides are side-effect
free, draw no random numbers and cannot raise on some data becomes ``_mend_rt.choose(note, test,
lambda: a, lambda: b)``. At run time (:func:`~.runtime.choose`) a one-element tensor test runs both
sides and selects in the graph; any other test is Python's conditional expression, evaluating one side.
``and``/``or`` of tensor tests in ``if``/``while``/``assert`` tests are handled where tests are
(``analysis.exact_items``, ``runtime.all_``/``any_``).
"""

from __future__ import annotations

import ast

from .analysis import Context, Purity, exact_items, located, maybe_tensor_test, purity, rt_call
from .items import own_statements

_NO_ARGS = ast.arguments([], [], None, [], [], None, [])


class _Conditionals(ast.NodeTransformer):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)  # inner ones first
        if not maybe_tensor_test(node.test, self.ctx):
            return node
        sides = Purity()
        purity(node.body, self.ctx, sides)
        purity(node.orelse, self.ctx, sides)
        if not sides.ok or sides.random or sides.may_fail or sides.modules:
            return node
        note = self.ctx.note(node, "conditional expression on a tensor -> torch.where")
        new = rt_call(
            "choose",
            ast.Constant(note),
            exact_items(node.test),
            ast.Lambda(_NO_ARGS, node.body),
            ast.Lambda(_NO_ARGS, node.orelse),
        )
        return located(ast.copy_location(new, node), node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        return node  # the user's own lambdas are left as written


def conditional_expressions(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Rewrite the tensor conditional expressions in ``fdef``'s assignments and returns, in place."""
    rewrite = _Conditionals(ctx)
    for s in own_statements(fdef.body):
        if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)) and s.value is not None:
            s.value = rewrite.visit(s.value)
