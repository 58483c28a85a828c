"""Legacy autograd: ``Variable(t)`` and ``Variable(t, requires_grad=False)`` -> ``t.detach()``;
``t.new().resize_(size)`` and ``t.new().resize_as_(u)`` -> ``t.new_empty(...)``.

Pre-0.4 code wraps tensors in ``torch.autograd.Variable``; Dynamo traces the bare call but breaks on
``requires_grad=``. Such a call (one positional argument, ``requires_grad`` absent or the constant
``False``) becomes ``_mend_rt.variable(note, t)``: ``t.detach()`` while Dynamo traces, the constructor
otherwise. ``Variable(t, requires_grad=True)`` makes a new leaf that needs gradients; Dynamo cannot
return such a tensor from a graph, so it is left as written (one break, as without mending).
``.data`` and ``requires_grad_`` inside ``forward`` are traced by Dynamo itself.

``torch.export`` does not trace ``.data``: non-strict export gives a tensor read through it no place in
the graph and refuses the program ("a fake tensor in the exported program constant's list": a focal
loss's ``Variable(logpt.data.exp())``). Mended for export (``Context.export``: inference only, where
``t.detach()`` is ``t.data``: the same values, no autograd), each read ``<e>.data`` becomes
``_mend_rt.data_of(note, <e>)``: ``e.detach()`` while export traces a tensor, ``e.data`` otherwise (an
object whose ``data`` is its own attribute, a ``PackedSequence``, keeps it). ``compile()`` never gets this
rule: under autograd, writes through ``.data`` are not seen by the version counter, and through
``detach()`` they are.

Pre-0.4 code also makes a fresh state tensor as ``x.data.new().resize_(n, h).fill_(0)`` (an RNN's
zero hidden state): an empty tensor of ``x``'s dtype and device, resized. Dynamo refuses ``resize_``
(a break at every such line); ``t.new_empty(size)`` is the same tensor, uninitialized and contiguous
as the resized one is. The call becomes ``_mend_rt.new_resized(note, t, "resize_", *size)``: that
while Dynamo traces a tensor, the code as written otherwise.

An ``autograd.Function`` whose ``backward`` only raises ("not differentiable, use the straight-through
one") and whose ``forward`` marks every value it returns non-differentiable (a vector quantizer's code
indices): while gradients are on and an input needs them, Dynamo traces the backward too, meets the
``raise`` and skips the whole frame. No output of such a call can reach its backward, and ``apply``
runs ``forward`` with gradients off whatever the caller's mode, so ``Fn.apply(...)`` (or a global alias
of it) becomes ``_mend_rt.no_backward_apply(note, Fn.apply, ...)``: under ``torch.no_grad()`` while
Dynamo traces (it then traces the forward alone), as written otherwise.

A Function whose ``backward`` reads ``ctx.saved_variables`` (the name of ``saved_tensors`` before 0.4,
still an alias in eager, with a warning): Dynamo knows only ``saved_tensors``, so tracing that backward
(gradients on and an input that needs them: a parameter) raises inside Dynamo and the whole frame runs
eagerly. A call of ``Fn.apply`` (a global alias of it, or ``Fn().apply``) becomes ``(_mend_modern_N.apply
if _mend_rt.tracing(note) else Fn.apply)(...)``: while Dynamo traces, the ``apply`` of a subclass of ``Fn``
of the same name whose ``backward`` is the user's compiled again from its source with ``saved_variables``
read as ``saved_tensors`` (the same tensors; the same file, lines and globals; made when the call is
rewritten and handed to the mended code as a free variable); ``Fn.apply`` otherwise. The same backward
reads ``Variable(t)`` as ``t.detach()`` (the rule above, which a backward, compiled in the user's globals,
spells out): a shake-shake layer's backward wraps its random mix in ``Variable``, and Dynamo, tracing that
backward, skips the constructor and the whole frame.

The same subclass carries the Function's ``forward`` mended by every rule a plain function gets, where
one applies: Dynamo traces ``Fn.forward`` itself (not a function the mend pass replaced), so a VQ-VAE's
``ctx.num_latents = int(np.prod(np.array(input.size()[2:])))`` (:mod:`.items`) skipped the whole frame.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import Any

import torch

from .analysis import RT, Context, located, rt_call

_VARIABLE = torch.autograd.Variable
_APPLY = getattr(torch.autograd.Function.apply, "__func__", None)  # the classmethod's function


def legacy_variables(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Rewrite the ``Variable(...)`` and ``t.new().resize_(...)`` calls of ``fdef`` in place."""
    new_then_resized(fdef, ctx)
    no_backward_applies(fdef, ctx)
    modern_applies(fdef, ctx)
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


def data_reads(fdef: ast.FunctionDef, ctx: Context) -> None:
    """``<e>.data`` read (not assigned) -> ``_mend_rt.data_of(note, <e>)``, for ``torch.export`` only."""

    class Reads(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
            self.generic_visit(node)
            if node.attr != "data" or not isinstance(node.ctx, ast.Load):
                return node
            note = ctx.note(node, "x.data -> x.detach() while torch.export traces (inference)")
            return located(ast.copy_location(rt_call("data_of", ast.Constant(note), node.value), node), node)

    Reads().visit(fdef)


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


def no_backward_applies(fdef: ast.FunctionDef, ctx: Context) -> None:
    """``Fn.apply(...)`` calls of ``fdef`` whose ``Fn`` :func:`has_no_backward`, in place."""
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        fn = ctx.resolve(call.func)
        if not has_no_backward(fn) or call.keywords:
            continue
        note = ctx.note(call, f"{fn.__self__.__name__}.apply: forward only (its backward only raises)")
        call.args = [located(ast.Constant(note), call), call.func, *call.args]
        call.func = located(
            ast.copy_location(ast.Attribute(ast.Name(RT, ast.Load()), "no_backward_apply", ast.Load()), call.func),
            call,
        )


def has_no_backward(fn: Any) -> bool:
    """Whether ``fn`` is ``Fn.apply`` of an ``autograd.Function`` whose ``backward`` is one ``raise`` and whose
    ``forward(ctx, ...)`` returns only names (or tuples of names) it passed to ``ctx.mark_non_differentiable``
    (no ``setup_context``, ``vjp`` or ``jvp`` of its own)."""
    owner = _applied(fn)
    if not (
        owner is not None
        and owner.setup_context is torch.autograd.Function.setup_context
        and owner.vjp is torch.autograd.Function.vjp
        and owner.jvp is torch.autograd.Function.jvp
    ):
        return False
    backward, forward = _parsed(owner.backward), _parsed(owner.forward)
    if backward is None or forward is None or not forward.args.args:
        return False
    body = backward.body[1:] if ast.get_docstring(backward) is not None else backward.body
    if not (len(body) == 1 and isinstance(body[0], ast.Raise)):
        return False
    ctx_name = forward.args.args[0].arg
    marked = {
        a.id
        for n in ast.walk(forward)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "mark_non_differentiable"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == ctx_name
        for a in n.args
        if isinstance(a, ast.Name)
    }
    returns = [n for n in ast.walk(forward) if isinstance(n, ast.Return)]
    if not returns or any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for n in ast.walk(forward)
        if n is not forward
    ):
        return False
    for r in returns:
        values = r.value.elts if isinstance(r.value, ast.Tuple) else [r.value]
        if not all(isinstance(v, ast.Name) and v.id in marked for v in values):
            return False
    return True


def modern_applies(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Calls of ``fdef`` of ``Fn.apply`` (or a global alias of it) and of ``Fn().apply`` whose ``Fn`` has a
    :func:`modern_function`, in place: ``Fn.apply`` becomes ``(<the modern class>.apply if
    _mend_rt.tracing(note) else Fn.apply)``, ``Fn()`` likewise ``(<the modern class> if ... else Fn)()``."""
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        func = call.func
        holder: ast.expr = call
        field_, attr = "func", "apply"  # the callee swapped for the modern class's apply
        owner: Any = _applied(ctx.resolve(func))
        if owner is None and isinstance(func, ast.Attribute) and func.attr == "apply":
            made_by = func.value  # Fn().apply: the classmethod through an instance; the class is swapped
            if isinstance(made_by, ast.Call) and not made_by.args and not made_by.keywords:
                holder, field_, attr = made_by, "func", ""
                owner = ctx.resolve(made_by.func)
        if not isinstance(owner, type):
            continue
        made = modern_function(owner)
        if made is None:
            continue
        cls, what, notes = made
        note = ctx.note(call, f"{owner.__name__}.{what}")
        # the mended forward's own rewrites (each with its own span and kind), reported with this frame's
        ctx.notes.extend(notes)
        name = ctx.fresh("modern_")
        ctx.injected[name] = cls
        test = ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), "tracing", ast.Load()), [ast.Constant(note)], [])
        modern: ast.expr = ast.Name(name, ast.Load())
        if attr:
            modern = ast.Attribute(modern, attr, ast.Load())
        swapped = getattr(holder, field_)
        setattr(holder, field_, located(ast.copy_location(ast.IfExp(test, modern, swapped), swapped), call))


_MODERN: dict[type, tuple[type, str, list[int]] | None] = {}


def modern_function(owner: type) -> tuple[type, str, list[int]] | None:
    """The subclass of the ``autograd.Function`` ``owner`` that Dynamo traces in its stead, what it
    changes and the notes of its mended ``forward``; or None where it
    changes nothing. Its ``backward`` reads ``saved_tensors`` where ``owner``'s reads
    ``<ctx>.saved_variables`` and ``t.detach()`` for ``Variable(t)`` (``<ctx>`` its first parameter; not where it has no source or needs a
    closure: a class made inside a function, a zero-argument ``super()``); its ``forward`` is ``owner``'s
    mended by the rules every other function gets (``pipeline.mend_function``), where one applies (a
    VQ-VAE's ``int(np.prod(np.array(input.size()[2:])))``). Made once per class."""
    if owner in _MODERN:
        return _MODERN[owner]
    made = None
    if issubclass(owner, torch.autograd.Function):
        body: dict[str, Any] = {}
        what: list[str] = []
        notes: list[int] = []
        backward = _static(owner, "backward")
        if (
            backward is not None
            and not backward.__code__.co_freevars
            and {"saved_variables", "Variable"} & set(backward.__code__.co_names)
        ):
            recompiled, changes = _modern_backward(backward)
            if recompiled is not None:
                body["backward"] = staticmethod(recompiled)
                what.extend(f"backward: {change}" for change in changes)
        forward = _static(owner, "forward")
        if forward is not None:
            from .pipeline import mend_function  # pipeline imports this module: read at call time

            mended = mend_function(forward, method=False, depth=1)
            if mended.func is not None:
                body["forward"] = staticmethod(mended.func)
                notes = list(mended.notes)
                what.append("forward: mended, its rewrites listed with this one")
        if body:
            meta: Any = type(owner)  # the Function's metaclass
            cls = meta(
                owner.__name__,
                (owner,),
                {**body, "__module__": owner.__module__, "__qualname__": owner.__qualname__},
            )
            made = (cls, "; ".join(what), notes)
    _MODERN[owner] = made
    return made


def _static(owner: type, name: str) -> types.FunctionType | None:
    """``owner``'s own static method ``name`` as a plain function, or None."""
    method = owner.__dict__.get(name)
    fn = method.__func__ if isinstance(method, staticmethod) else None
    return fn if isinstance(fn, types.FunctionType) else None


def _modern_backward(fn: types.FunctionType) -> tuple[types.FunctionType | None, list[str]]:
    """``fn`` (a Function's ``backward``) compiled again from its source, in its own file, lines and
    globals, with each ``<ctx>.saved_variables`` read as ``<ctx>.saved_tensors`` and each ``Variable(t)``
    (``requires_grad`` absent or ``False``, never set later) as ``t.detach()``, what ``Variable`` gives
    while Dynamo traces (a shake-shake layer's backward wraps its random mix so: Dynamo skips the
    constructor and the whole frame with it); and what it changed. ``(None, [])`` where it changes nothing."""
    fdef = _parsed(fn)
    if fdef is None or fdef.name != fn.__name__ or not fdef.args.args:
        return None, []
    changes = []
    if _saved_tensors(fdef):
        changes.append("ctx.saved_variables -> ctx.saved_tensors")
    if _detached_variables(fdef, fn.__globals__):
        changes.append("Variable(t) -> t.detach()")
    if not changes:
        return None, []
    fdef.decorator_list = []
    tree = ast.Module([fdef], [])
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)  # the source read starts at its first decorator
    ast.fix_missing_locations(tree)
    space: dict[str, Any] = {}
    exec(compile(tree, fn.__code__.co_filename, "exec"), fn.__globals__, space)  # noqa: S102 -- the user's own code
    backward: types.FunctionType = space[fn.__name__]
    backward.__qualname__, backward.__defaults__ = fn.__qualname__, fn.__defaults__
    return backward, changes


def _detached_variables(fdef: ast.FunctionDef, names: dict[str, Any]) -> bool:
    """Each ``Variable(t)`` of ``fdef`` (the name read from ``names``, a function's globals) with no
    ``requires_grad`` but ``False`` and none set later becomes ``t.detach()``, in place; whether one did."""
    grad_set = _requires_grad_set(fdef)
    found = False
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        if (
            _global_value(call.func, names) is not _VARIABLE
            or len(call.args) != 1
            or isinstance(call.args[0], ast.Starred)
            or id(call) in grad_set
            or not all(
                k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in call.keywords
            )
        ):
            continue
        call.func = ast.copy_location(ast.Attribute(call.args[0], "detach", ast.Load()), call.func)
        call.args, call.keywords = [], []
        found = True
    return found


def _global_value(node: ast.expr, names: dict[str, Any]) -> Any:
    """What a name or dotted name (``Variable``, ``torch.autograd.Variable``) reads from ``names``, or None."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(_global_value(node.value, names), node.attr, None)
    return None


def _saved_tensors(fdef: ast.FunctionDef) -> bool:
    """Each ``<ctx>.saved_variables`` of ``fdef`` (a Function's ``backward``) read as ``<ctx>.saved_tensors``,
    in place; whether one was."""
    ctx_name = fdef.args.args[0].arg
    read = [
        n
        for n in ast.walk(fdef)
        if isinstance(n, ast.Attribute)
        and n.attr == "saved_variables"
        and isinstance(n.value, ast.Name)
        and n.value.id == ctx_name
        and isinstance(n.ctx, ast.Load)
    ]
    for n in read:
        n.attr = "saved_tensors"
    return bool(read)


def _applied(fn: Any) -> type[torch.autograd.Function] | None:
    """The ``autograd.Function`` subclass ``Fn`` where ``fn`` is ``Fn.apply``, else None."""
    owner = getattr(fn, "__self__", None)
    if (
        isinstance(fn, types.MethodType)
        and isinstance(owner, type)
        and issubclass(owner, torch.autograd.Function)
        and fn.__func__ is _APPLY
    ):
        return owner
    return None


def _parsed(method: Any) -> ast.FunctionDef | None:
    """The definition of a static method, parsed from its source, or None where there is none to read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError, SyntaxError):
        return None
    first = tree.body[0] if tree.body else None
    return first if isinstance(first, ast.FunctionDef) else None
