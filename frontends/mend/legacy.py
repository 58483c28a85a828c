"""Legacy autograd: ``Variable(t)`` and ``Variable(t, requires_grad=False)`` -> ``t.detach()``.

Pre-0.4 code wraps tensors in ``torch.autograd.Variable``; Dynamo traces the bare call but breaks on
``requires_grad=``. Such a call (one positional argument, ``requires_grad`` absent or the constant
``False``) becomes ``_mend_rt.variable(note, t)``: ``t.detach()`` while Dynamo traces, the constructor
otherwise. ``Variable(t, requires_grad=True)`` makes a new leaf that needs gradients; Dynamo cannot
return such a tensor from a graph, so it is left as written (one break, as without mending).
``.data`` and ``requires_grad_`` inside ``forward`` are traced by Dynamo itself.
"""

from __future__ import annotations

import ast

import torch

from .analysis import RT, Context, located

_VARIABLE = torch.autograd.Variable


def legacy_variables(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Rewrite the ``Variable(...)`` calls of ``fdef`` in place."""
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        if ctx.resolve(call.func) is not _VARIABLE or len(call.args) != 1 or isinstance(call.args[0], ast.Starred):
            continue
        if not all(
            k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in call.keywords
        ):
            continue
        note = ctx.note(call, "Variable(t) -> t.detach()")
        call.func = located(
            ast.copy_location(ast.Attribute(ast.Name(RT, ast.Load()), "variable", ast.Load()), call.func), call
        )
        call.args = [located(ast.Constant(note), call), call.args[0]]
        call.keywords = []
