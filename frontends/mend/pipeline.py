"""Mend: rewrite the user's Python so Dynamo captures it in fewer graphs, before Dynamo sees it.

This docstring is the one description of the whole algorithm; each rule module describes its rule.

Pipeline (``mend(model)``, run by ``torchmux.compile`` and ``torchmux.explain`` unless
``options={"mend": False}``):

1. **Find the code.** For the model's ``forward`` (every submodule's whose class is not torch's own),
   the ``self.<method>`` helpers it calls and the user's functions it calls by a global name
   (``helper(x)``, ``Class.static_method(x)``, ``module.helper(x)``), read the source
   (``inspect``); without source, or for a lambda, a generator, a wrapped function or one using private
   ``__names`` or frame introspection, do nothing. The source must be what the code was compiled from.
2. **Rewrite the AST** (:mod:`.statements` walks the body and hands each statement to its rule):

   - :mod:`.attrs`: ``cfg.scale`` on a dict with ``__getattr__ = dict.__getitem__`` -> ``cfg["scale"]``;
   - :mod:`.legacy`: ``Variable(t)`` -> ``t.detach()``, ``t.new().resize_(size)`` -> ``t.new_empty(size)``;
   - :mod:`.expressions`: ``a if <tensor> else b`` -> ``torch.where``;
   - :mod:`.effects`: ``print`` / ``warnings.warn`` / logging statements are replayed after the graph
     with the user's text, file and line;
   - :mod:`.items`: ``m = t.item()`` / ``.tolist()`` where ``m`` is only logged keeps ``m`` a tensor;
     ``n = random.randint(a, b)`` tells Dynamo ``a <= n <= b`` (``torch._check``);
   - :mod:`.checks`: ``if <tensor>: raise`` and ``assert <tensor>`` are checked after the graph;
   - :mod:`.branches`: tensor ``if``/``elif``/``else`` and early returns -> ``torch.where`` /
     ``torch.cond`` (``and``/``or`` of tensor tests included, with Python's short circuit);
   - :mod:`.loops`: ``while <tensor>`` (a Python counter beside it included) and
     ``for _ in range(<tensor data>)`` -> ``torch.while_loop``; ``for layer in layers: ...;
     if <tensor>: break`` -> a masked loop (values frozen once the test held);
   - :mod:`.rnn`: an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` submodule gets a forward (on the instance)
     that Dynamo traces as plain tensor ops;

   :mod:`.analysis` holds what the rules share (name resolution, purity, AST helpers). Every rewrite
   keeps the user's statements behind a guard decided while Dynamo traces (:mod:`.runtime`): when the
   test is not a one-element tensor, or a ``self.<module>`` call is not a known side-effect-free module,
   the original code runs. Nothing is rewritten that cannot be shown safe from the source.
3. **Compile** the rewritten function with the user's file name and line numbers, with the original
   closure cells and globals, so errors, tracebacks and break reports point at the user's code.
4. **Install** it by binding the new function to the *instance* (``module.forward = MethodType(...)``);
   the class and its other instances are untouched. A rewritten global helper is reached through a
   guard ``(mended if helper is original else helper)``, so rebinding the global still works.
5. **Switch** Dynamo's own options on while Dynamo traces a compiled module (around each call of a
   compiled function), restored after (:mod:`.switches`).
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import contextvars
import copy
import functools
import inspect
import os
import re
import sys
import types
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.userframe import in_torch
from . import attrs, rnn
from . import runtime as rt
from .analysis import RT, TYPE_PARAMS, Context, names_stored, pure_forward
from .statements import rewrite

#: torchmux.frontends.mend's folder: its runtime helpers are torchmux's code, never the user's
MEND_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PRIVATE = re.compile(r"^__\w*[^_]_?$")  # a name Python would mangle inside a class body
_INTROSPECTION = {"locals", "vars", "exec", "eval", "_getframe", "currentframe"}
_MAX_DEPTH = 4  # how deep global helper calls are followed
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")  # an installed library's file


@dataclass
class Mended:
    """What mending one function gave: the new function (None if nothing fired) and notes."""

    func: types.FunctionType | None
    notes: list[int] = field(default_factory=list)  # keys of the runtime's NOTES
    methods: set[str] = field(default_factory=set)  # self.<name>(...) calls, for the caller to follow
    pure_calls: tuple[str, ...] | None = None  # a side-effect-free forward: the self.<modules> it calls
    source: str = ""  # the rewritten function, for reading (:func:`source_of`)


_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], Mended]] = weakref.WeakKeyDictionary()
# fn -> (method?, self.<attribute dicts>, self.<functions>, for torch.export?) -> result

#: set while :func:`mended` installs code for ``torch.export`` (``frontends/export.py``): the rules that
#: hold only for an inference trace apply too (``Context.export``)
_FOR_EXPORT: contextvars.ContextVar[bool] = contextvars.ContextVar("torchmux_mend_for_export", default=False)


class Rewrites:
    """The rewrites applied to one model. Iterating gives those Dynamo traced through since ``mend``
    ("file:line: what"), which is what explain reports; ``applied`` lists them all."""

    def __init__(self, keys: list[int]) -> None:
        self.keys = list(dict.fromkeys(keys))
        rt.FIRED.difference_update(self.keys)

    @property
    def applied(self) -> list[str]:
        return _by_place(rt.NOTES[k] for k in self.keys)

    def __iter__(self) -> Iterator[str]:
        return iter(_by_place(rt.NOTES[k] for k in self.keys if k in rt.FIRED))

    def __len__(self) -> int:
        return len(list(iter(self)))


def _by_place(notes: Iterable[str]) -> list[str]:
    def place(note: str) -> tuple[str, int]:
        where = note.split(": ", 1)[0]
        path, _, line = where.rpartition(":")
        return path, int(line) if line.isdigit() else 0

    return sorted(notes, key=place)


def mend(model: Any) -> tuple[Any, Rewrites]:
    """Install mended code for ``model``; return what to compile and its :class:`Rewrites`.

    An ``nn.Module`` is returned itself, with mended methods bound on its (sub)module instances; a
    function comes back as a new function; anything else comes back unchanged.
    """
    notes: list[int] = []
    if isinstance(model, torch.nn.Module):
        for name, m in model.named_modules():
            _install(m, notes)
            for held in _held_objects(m):
                _install(held, notes, all_methods=True)
            rnn.install(m, _where(model, name), notes)
        return model, Rewrites(notes)
    if isinstance(model, types.MethodType) and isinstance(model.__func__, types.FunctionType):
        owner, fn = model.__self__, _original(model.__func__)
        if hasattr(owner, "__dict__"):
            done = mend_function(fn, method=True, attr_dicts=attrs.held_by(owner), functions=held_functions(owner))
        else:
            done = mend_function(fn, method=True)
        if done.func is None:
            return model, Rewrites([])
        return types.MethodType(done.func, model.__self__), Rewrites(done.notes)
    if isinstance(model, types.FunctionType):
        done = mend_function(_original(model), method=False)
        return (done.func or model), Rewrites(done.notes)
    return model, Rewrites([])


def _original(fn: types.FunctionType) -> types.FunctionType:
    """The user's function behind a mended one (mending twice gives the same function and notes)."""
    return getattr(fn, "_torchmux_mended_from", fn)


@contextlib.contextmanager
def mended(model: Any, enabled: bool = True, export: bool = False) -> Iterator[tuple[Any, Rewrites]]:
    """``mend`` for one run: the instances get their own methods back afterwards (used by explain).
    ``export``: for ``torch.export`` (inference), with the rules that hold only there."""
    if not enabled:
        yield model, Rewrites([])
        return
    before = _bound_state(model)
    try:
        token = _FOR_EXPORT.set(export)
        try:
            installed = mend(model)
        finally:
            _FOR_EXPORT.reset(token)
        yield installed
    finally:
        for m, saved in before:
            for name in list(vars(m)):
                if name not in saved and _is_mended(vars(m)[name]):
                    delattr(m, name)


def unmend(model: Any) -> None:
    """The user's own methods back on every instance ``mend`` bound mended ones to (``model``, its
    submodules and the objects they hold): the code as written runs again (compile()'s verdict)."""
    for m, names in _bound_state(model):
        for name in names:
            if _is_mended(vars(m)[name]):
                delattr(m, name)


def _is_mended(value: Any) -> bool:
    return isinstance(value, (types.MethodType, types.FunctionType)) and hasattr(
        getattr(value, "__func__", value), "_torchmux_mended_from"
    )


def _where(model: torch.nn.Module, name: str) -> str:
    """ "file:line: self.<name>" for submodule ``name`` of ``model``: the model's forward, where it is called."""
    code = getattr(type(model).forward, "__code__", None)
    place = f"{code.co_filename}:{code.co_firstlineno}" if code else type(model).__qualname__
    return f"{place}: self.{name}" if name else place


def _bound_state(model: Any) -> list[tuple[Any, set[str]]]:
    if not isinstance(model, torch.nn.Module):
        return []
    owners = [o for m in model.modules() for o in (m, *_held_objects(m))]
    return [(o, set(vars(o))) for o in owners]


def _held_objects(m: torch.nn.Module) -> list[Any]:
    """The plain objects of the user's classes that ``m`` holds in its attributes (a helper object whose
    methods its forward calls: ``self.window.glimpse(x)``): not modules, tensors or functions, nor objects
    of the standard library's, torch's or an installed library's classes (a Hugging Face config: its
    methods are the library's, and bound copies in its ``__dict__`` would follow it into ``deepcopy``)."""
    held = []
    for value in vars(m).values():
        cls = type(value)
        top = cls.__module__.split(".")[0]
        if (
            isinstance(value, (torch.nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType))
            or not hasattr(value, "__dict__")
            or top in sys.stdlib_module_names
            or top in ("torch", "numpy", "torchmux")
        ):
            continue
        try:
            source = inspect.getsourcefile(cls)
        except TypeError:  # a builtin or C extension's class
            continue
        path = os.path.abspath(source) if source is not None else ""
        if path and not in_torch(path) and not _INSTALLED.search(path):  # the user's own code, not a library's
            held.append(value)
    return held


def _install(m: Any, notes: list[int], all_methods: bool = False) -> None:
    """Mend ``m.forward`` and the ``self.<method>`` helpers it reaches (``all_methods``: every method of
    ``m``'s class, for a held object whose methods a module calls); bind the results to ``m``. A
    ``staticmethod`` is mended as a function and set on the instance as one."""
    cls = type(m)
    todo = ["forward"]
    if all_methods:
        todo = [n for n in dir(cls) if not _PRIVATE.match(n) and not n.startswith("__")]
    seen: set[str] = set()
    dicts, functions = attrs.held_by(m), held_functions(m)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        current = vars(m).get(name)
        fn = inspect.getattr_static(cls, name, None)
        if isinstance(fn, staticmethod) and isinstance(fn.__func__, types.FunctionType):
            if _is_user_code(fn.__func__) and (current is None or getattr(current, "_torchmux_mended_from", None)):
                done = mend_function(fn.__func__, method=False)
                if done.func is not None:
                    object.__setattr__(m, name, done.func)
                    notes.extend(done.notes)
            continue
        if current is not None and not hasattr(getattr(current, "__func__", None), "_torchmux_mended_from"):
            continue  # the user set this on the instance: leave it
        if not isinstance(fn, types.FunctionType) or not _is_user_code(fn):
            continue
        done = mend_function(fn, method=True, attr_dicts=dicts, functions=functions)
        todo.extend(done.methods)
        if name == "forward" and done.pure_calls is not None and isinstance(m, torch.nn.Module):
            rt.PURE_FORWARDS[cls] = (fn, done.pure_calls)  # loops over such modules may be masked
        if done.func is not None:
            object.__setattr__(m, name, types.MethodType(done.func, m))
            notes.extend(done.notes)


def held_functions(m: Any) -> frozenset[tuple[str, types.FunctionType]]:
    """The user's plain functions ``m`` holds in its own attributes (``self.loss = _focal_loss`` in
    ``__init__``): its methods call them as ``self.loss(x)``, and the mend pass follows them as it follows
    a global function (through the same identity guard, so the instance is never changed)."""
    return frozenset(
        (k, v)
        for k, v in vars(m).items()
        if isinstance(v, types.FunctionType) and _is_user_code(v) and not _is_mended(v)
    )


def _is_user_code(fn: types.FunctionType) -> bool:
    path = os.path.abspath(fn.__code__.co_filename)
    return not (in_torch(path) or path.startswith(MEND_DIR) or fn.__code__.co_filename.startswith("<"))


def mend_function(
    fn: types.FunctionType,
    method: bool,
    depth: int = 0,
    attr_dicts: frozenset[str] = frozenset(),
    functions: frozenset[tuple[str, types.FunctionType]] = frozenset(),
) -> Mended:
    """The mended version of ``fn`` (cached), or ``Mended(None)`` when nothing fired or it cannot be done.

    ``attr_dicts``: the ``self.<name>`` that hold attribute dicts on the instance (:mod:`.attrs`);
    ``functions``: the ``self.<name>`` that hold the user's functions (:func:`held_functions`)."""
    known = _CACHE.setdefault(fn, {})
    key = (method, attr_dicts, functions, _FOR_EXPORT.get())
    if key in known:
        return known[key]
    known[key] = Mended(None)  # recursion guard: a function calling itself is followed once
    try:
        result = _mend(fn, method, depth, attr_dicts, functions)
    except (OSError, TypeError, SyntaxError, IndentationError):  # no source, or not a plain def
        result = Mended(None)
    known[key] = result
    return result


def source_of(fn: Any) -> str:
    """The rewritten source of ``fn`` (a function or method), or "" if mending changed nothing."""
    fn = getattr(fn, "__func__", fn)
    fn = getattr(fn, "_torchmux_mended_from", fn)
    parts = fn.__qualname__.split(".")
    return mend_function(fn, method=len(parts) > 1 and parts[-2] != "<locals>").source


def _parse(fn: types.FunctionType) -> ast.FunctionDef | None:
    code = fn.__code__
    if code.co_name == "<lambda>" or code.co_flags & (
        inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
    ):
        return None
    if hasattr(fn, "__wrapped__"):  # a decorator's wrapper: the wrapped function cannot be re-wrapped safely
        return None
    lines, first = inspect.getsourcelines(fn)
    text = "".join(lines)
    indented = text[:1] in (" ", "\t")  # a method: parse it inside a block (dedenting would change string literals)
    tree = ast.parse("if True:\n" + text if indented else text)
    body = tree.body[0].body if indented and isinstance(tree.body[0], ast.If) else tree.body
    if len(body) != 1 or not isinstance(body[0], ast.FunctionDef):
        return None
    fdef = body[0]
    if fdef.name != code.co_name or first != code.co_firstlineno:
        return None
    ast.increment_lineno(fdef, first - 2 if indented else first - 1)
    for n in ast.walk(fdef):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and _PRIVATE.match(name):  # mangled by the class body; recompiling would not mangle it
            return None
        if name in _INTROSPECTION:  # sees the frame's locals, which the rewrite changes
            return None
    if fdef.decorator_list:  # the code's first line is the first decorator's (``@staticmethod``): keep it so
        fdef.lineno = fdef.decorator_list[0].lineno
    fdef.decorator_list = []  # they returned ``fn`` itself (no __wrapped__, same code object)
    return fdef if _same_code(fn, fdef) else None


def _mend(
    fn: types.FunctionType,
    method: bool,
    depth: int,
    attr_dicts: frozenset[str],
    functions: frozenset[tuple[str, types.FunctionType]],
) -> Mended:
    fdef = _parse(fn)
    if fdef is None:
        return Mended(None)
    filename = fn.__code__.co_filename
    args = fdef.args.posonlyargs + fdef.args.args
    ctx = Context(filename, fn.__globals__, fn.__name__, args[0].arg if method and args else None)
    ctx.attr_dicts, ctx.export = attr_dicts, _FOR_EXPORT.get()
    ctx.held_functions = dict(functions) if ctx.self_name else {}
    pure_calls = None
    if method and fn.__name__ == "forward":
        ctx.locals = {a.arg for a in args} | names_stored(fdef.body)
        pure_calls = pure_forward(fdef, ctx)
    rewrite(fdef, ctx)
    injected: dict[str, Any] = {RT: rt, **ctx.injected}
    if depth < _MAX_DEPTH:
        _follow_globals(fdef, ctx, injected, depth)
    methods = {
        c.func.attr
        for c in ast.walk(fdef)
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and isinstance(c.func.value, ast.Name)
        and c.func.value.id == ctx.self_name
    }
    if not ctx.notes:
        return Mended(None, [], methods, pure_calls=pure_calls)
    return Mended(_build(fn, fdef, injected), ctx.notes, methods, source=ast.unparse(fdef), pure_calls=pure_calls)


def _follow_globals(fdef: ast.FunctionDef, ctx: Context, injected: dict[str, Any], depth: int) -> None:
    """Mend the user's functions this one calls by a global name (``helper(x)``, ``Class.static(x)``,
    ``module.helper(x)``) or through the instance (``self.loss(x)``, :func:`held_functions`); call them
    through an identity guard, so rebinding the name still works."""
    for call in [c for c in ast.walk(fdef) if isinstance(c, ast.Call)]:
        func = call.func
        dotted = _dotted(func)
        if dotted is None or dotted.startswith("_mend_"):
            continue
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == ctx.self_name:
            target = ctx.held_functions.get(func.attr)
        else:
            target = ctx.resolve(func)
        if not isinstance(target, types.FunctionType) or not _is_user_code(target):
            continue
        done = mend_function(target, method=False, depth=depth + 1)
        if done.func is None:
            continue
        key = dotted.replace(".", "__")
        new, old = f"_mend_g_{key}", f"_mend_o_{key}"
        injected[new], injected[old] = done.func, target
        guard = ast.IfExp(
            ast.Compare(copy.deepcopy(func), [ast.Is()], [ast.Name(old, ast.Load())]),
            ast.Name(new, ast.Load()),
            copy.deepcopy(func),
        )
        call.func = ast.copy_location(guard, func)
        ctx.notes.extend(done.notes)


def _dotted(expr: ast.expr) -> str | None:
    """``a.b.c`` for a call's function named by a global and attributes (``ctx.resolve`` decides what it
    means: attributes are followed on modules and classes only), else None."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr}"
    return None


_FUTURE_FLAGS = functools.reduce(
    lambda a, b: a | b, (getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
)


def _compile_inner(fn: types.FunctionType, fdef: ast.FunctionDef, params: list[str]) -> types.CodeType:
    """The code object of ``fdef`` compiled inside ``def _mend_factory(*params)``, so that ``fn``'s free
    variables and the injected names are closure cells; with ``fn``'s file name and ``__future__`` flags."""
    fdef.name = "_mend_inner"  # not the user's name: a recursive call must still find the global
    factory = ast.FunctionDef(
        "_mend_factory",
        ast.arguments([], [ast.arg(p) for p in params], None, [], [], None, []),
        [fdef, ast.Return(ast.Name(fdef.name, ast.Load()))],
        [],
        None,
        **TYPE_PARAMS,
    )
    ast.copy_location(factory, fdef)
    module = ast.fix_missing_locations(ast.Module([factory], []))
    top = compile(
        module, fn.__code__.co_filename, "exec", flags=fn.__code__.co_flags & _FUTURE_FLAGS, dont_inherit=True
    )
    fcode = next(c for c in top.co_consts if isinstance(c, types.CodeType) and c.co_name == "_mend_factory")
    inner = next(c for c in fcode.co_consts if isinstance(c, types.CodeType) and c.co_name == "_mend_inner")
    names: dict[str, Any] = {"co_name": fn.__code__.co_name}
    if hasattr(fn.__code__, "co_qualname"):  # Python 3.11+
        names["co_qualname"] = fn.__code__.co_qualname
    return inner.replace(**names)


def _same_code(fn: types.FunctionType, fdef: ast.FunctionDef) -> bool:
    """True if the source read for ``fn`` is the source ``fn`` was compiled from (the file was not edited).

    Compares names, constants and lines, not bytecode: compiled alone, ``module.f()`` becomes a method
    call where the module's own compilation knew ``module`` was an import.
    """
    mine = _compile_inner(fn, copy.deepcopy(fdef), list(fn.__code__.co_freevars))
    return _fingerprint(mine, fn.__code__.co_name) == _fingerprint(fn.__code__, fn.__code__.co_name)


def _fingerprint(code: types.CodeType, name: str) -> tuple[Any, ...]:
    consts = tuple(_fingerprint(c, c.co_name) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    lines = tuple(sorted({line for _, _, line in code.co_lines() if line is not None}))
    return (
        name,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        code.co_argcount,
        code.co_kwonlyargcount,
        consts,
        lines,
    )


def _build(fn: types.FunctionType, fdef: ast.FunctionDef, injected: dict[str, Any]) -> types.FunctionType:
    """Compile ``fdef`` at the user's file and lines, with ``fn``'s globals, defaults and closure cells."""
    free = list(fn.__code__.co_freevars)
    inner = _compile_inner(fn, copy.deepcopy(fdef), free + [n for n in injected if n not in free])
    cells = dict(zip(free, fn.__closure__ or ()))
    closure = tuple(cells[n] if n in cells else types.CellType(injected[n]) for n in inner.co_freevars)
    new = types.FunctionType(inner, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__dict__.update(fn.__dict__)
    new._torchmux_mended_from = fn  # type: ignore[attr-defined]
    return new
