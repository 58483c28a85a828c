"""Legacy autograd: ``Variable(t)`` and ``Variable(t, requires_grad=False)`` -> ``t.detach()``;
``t.new().resize_(size)`` and ``t.new().resize_as_(u)`` -> ``t.new_empty(...)``.

Pre-0.4 code wraps tensors in ``torch.autograd.Variable``; Dynamo traces the bare call but breaks on
``requires_grad=``. Such a call (one positional argument, ``requires_grad`` absent or the constant
``False``) becomes ``_mend_rt.variable(note, t)``: ``t.detach()`` while Dynamo traces, the constructor
otherwise. ``Variable(t, requires_grad=True)`` makes a new leaf that needs gradients; Dynamo cannot
return such a tensor from a graph, so it is left as written (one break, as without mending).
``.data`` and ``requires_grad_`` inside ``forward`` are traced by Dynamo itself.

Pre-0.4 code also makes a fresh state tensor as ``x.data.new().resize_(n, h).fill_(0)`` (an RNN's
zero hidden state): an empty tensor of ``x``'s dtype and device, resized. Dynamo refuses ``resize_``
(a break at every such line); ``t.new_empty(size)`` is the same tensor, uninitialized and contiguous
as the resized one is. The call becomes ``_mend_rt.new_resized(note, t, "resize_", *size)``: that
while Dynamo traces a tensor, the code as written otherwise.
"""

from __future__ import annotations

import ast

import torch

from .analysis import RT, Context, located

_VARIABLE = torch.autograd.Variable


def legacy_variables(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Rewrite the ``Variable(...)`` and ``t.new().resize_(...)`` calls of ``fdef`` in place."""
    new_then_resized(fdef, ctx)
    grad_set = _requires_grad_set(fdef)
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        if ctx.resolve(call.func) is not _VARIABLE or len(call.args) != 1 or isinstance(call.args[0], ast.Starred):
            continue
        if id(call) in grad_set:  # its value gets requires_grad set: a detached tensor would break there
            continue
        if not all(
            k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in call.keywords
        ):
            continue
        note = ctx.note(call, "Variable(t) -> t.detach()", wide=True)  # not a leaf any more
        call.func = located(
            ast.copy_location(ast.Attribute(ast.Name(RT, ast.Load()), "variable", ast.Load()), call.func), call
        )
        call.args = [located(ast.Constant(note), call), call.args[0]]
        call.keywords = []


def _requires_grad_set(fdef: ast.FunctionDef) -> set[int]:
    """The ``Variable(...)`` calls (by ``id``) whose value has ``requires_grad`` set later: assigned to a name
    that gets ``.requires_grad = ...`` or ``.requires_grad_(...)`` in ``fdef`` (itself or through plain
    ``a = b`` aliases), or called on directly. The
    legacy constructor's tensor is a leaf, and Dynamo traces setting its ``requires_grad``; on
    ``t.detach()`` of a graph value it breaks ("setattr() on Tensor.requires_grad")."""
    names: set[str] = set()
    direct: set[int] = set()
    for n in ast.walk(fdef):
        target: ast.expr | None = None
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Attribute) and t.attr == "requires_grad":
                    target = t.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "requires_grad_":
            target = n.func.value
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Call):
            direct.add(id(target))
    aliases = [
        (n.targets[0].id, n.value.id)
        for n in ast.walk(fdef)
        if isinstance(n, ast.Assign)
        and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Name)
        and isinstance(n.value, ast.Name)
    ]
    grown = True
    while grown:  # ``w = z; w.requires_grad = True``: z's value gets it too
        grown = False
        for alias, source in aliases:
            if alias in names and source not in names:
                names.add(source)
                grown = True
    if names:
        for n in ast.walk(fdef):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call):
                if any(isinstance(t, ast.Name) and t.id in names for t in n.targets):
                    direct.add(id(n.value))
    return direct


def new_then_resized(fdef: ast.FunctionDef, ctx: Context) -> None:
    """``<t>.new().resize_(<sizes>)`` / ``<t>.new().resize_as_(<u>)``, no keywords, no ``*``, in place."""
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        func, made = call.func, getattr(call.func, "value", None)
        if not (
            isinstance(func, ast.Attribute)
            and func.attr in ("resize_", "resize_as_")
            and call.args
            and not call.keywords
            and not any(isinstance(a, ast.Starred) for a in call.args)
            and isinstance(made, ast.Call)
            and isinstance(made.func, ast.Attribute)
            and made.func.attr == "new"
            and not made.args
            and not made.keywords
        ):
            continue
        note = ctx.note(call, f"t.new().{func.attr}(...) -> t.new_empty(...)")
        source = made.func.value
        call.func = located(
            ast.copy_location(ast.Attribute(ast.Name(RT, ast.Load()), "new_resized", ast.Load()), func), call
        )
        call.args = [located(ast.Constant(note), call), source, located(ast.Constant(func.attr), call), *call.args]
