"""The AST rewrites that remove graph breaks from one function (see :mod:`torchmux.frontends.mend`).

``rewrite(fdef, ctx)`` takes the ``ast.FunctionDef`` of a user function and returns the number of
rewrites applied (``ctx.notes`` says which, where). The rewritten code calls helpers from
:mod:`torchmux.frontends._mend_runtime`, reachable as the free variable ``_mend_rt``. Rules:

1. **Deferred effects.** ``print(...)``, ``warnings.warn(...)`` and ``<logger>.info/...(...)`` as a
   statement become ``_mend_rt.deferred(key, *values)``; Dynamo moves that call after the graph (it is
   registered in ``reorderable_logging_functions``) and it replays the call with the user's text,
   file and line. f-strings and ``.item()``/``.tolist()`` inside the arguments are taken apart so the
   tensor travels out of the graph and is formatted afterwards.
2. **.item()/.tolist() for logging.** ``m = t.item()`` where ``m`` is only logged (or never used)
   keeps ``m`` a tensor; the conversion happens when the log is replayed.
3. **Checks.** ``if c: raise E(msg)`` and ``assert c, msg`` at the top of a function whose remaining
   statements have no side effect become a deferred check that raises ``E(msg)`` after the graph.
4. **Tensor if/else.** An ``if`` whose branches only assign pure expressions to names (or return
   one), including an early ``if c: return a`` followed by the rest of the function, becomes
   ``torch.where`` when both branches are pure, ``torch.cond`` when a branch draws random numbers or
   needs autograd. The test is guarded at run time: when the condition is not a one-element tensor,
   or a called module is not a known side-effect-free one, the original statements run.

Nothing is rewritten that cannot be shown safe from the source: unknown calls, attribute or item
stores, in-place methods, loops with data-dependent bounds and nested functions are left as written.
"""

from __future__ import annotations

import ast
import builtins
import copy
import logging
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _mend_runtime as rt

RT = "_mend_rt"  # the free variable through which mended code reaches the runtime helpers

#: functions that draw random numbers (by name, under torch, torch.nn.functional, Tensor)
RANDOM = {
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "multinomial", "normal", "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "rrelu", "gumbel_softmax", "native_dropout",
}
#: functions that raise on some data (indices out of range, singular matrices, bad targets)
MAY_FAIL = {
    "gather", "index_select", "take", "take_along_dim", "embedding", "embedding_bag", "one_hot", "bincount",
    "scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill", "index_put",
    "cholesky", "cholesky_inverse", "inverse", "inv", "solve", "lu", "lu_factor", "lu_solve", "triangular_solve",
    "nll_loss", "cross_entropy", "multi_margin_loss", "ctc_loss", "item", "repeat_interleave", "unflatten",
}
#: method names that mutate a Python container (a receiver we cannot type could be one)
CONTAINER_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
                      "add", "discard", "sort", "reverse", "popitem", "put"}
#: Tensor methods with an effect outside the value they return
IMPURE_METHODS = {"item", "tolist", "numpy", "backward", "register_hook", "retain_grad", "record_stream",
                  "share_memory_", "data_ptr", "storage", "untyped_storage"}
#: builtins that are pure on any argument we let through
PURE_BUILTINS = {"abs", "min", "max", "float", "int", "bool", "round", "pow", "len", "tuple", "range",
                 "isinstance", "divmod"}
LOG_METHODS = set(rt._LEVELS)
_TYPE_PARAMS: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}
_TENSOR_ATTRS = set(dir(torch.Tensor))


@dataclass
class Context:
    """What a rewrite needs to know about the function it works on."""

    filename: str
    globals: dict[str, Any]
    funcname: str
    self_name: str | None  # the first parameter of a method
    locals: set[str] = field(default_factory=set)  # names bound anywhere in the function
    notes: list[int] = field(default_factory=list)  # keys of _mend_rt.NOTES
    counter: int = 0

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"_mend_{stem}{self.counter}"

    def note(self, node: ast.AST, text: str) -> int:
        """Register a rewrite ("file:line: what"); the code emitted for it calls ``fired(key)`` when traced."""
        key = rt.note(f"{self.filename}:{getattr(node, 'lineno', 0)}: {text}")
        self.notes.append(key)
        return key

    # --- name resolution (at mend time, in the function's globals) ----------------------------------

    def resolve(self, expr: ast.expr) -> Any:
        """The object a global dotted name (``torch.nn.functional.relu``) means now, or None.

        Attributes are only followed on modules and classes, so no property runs.
        """
        if isinstance(expr, ast.Name):
            if expr.id in self.locals:
                return None
            if expr.id in self.globals:
                return self.globals[expr.id]
            return getattr(builtins, expr.id, None)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(expr.value)
            if isinstance(base, (types.ModuleType, type)):
                return getattr(base, expr.attr, None)
        return None

    def is_global_expr(self, expr: ast.expr) -> bool:
        return self.resolve(expr) is not None


def _call(func: str, *args: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), func, ast.Load()), list(args), [])


def _name(id: str, store: bool = False) -> ast.Name:
    return ast.Name(id, ast.Store() if store else ast.Load())


def _at(new: Any, old: ast.AST) -> Any:
    """Give the nodes of ``new`` that have no location ``old``'s, so errors point at the user's line."""
    for n in new if isinstance(new, list) else [new]:
        for sub in ast.walk(n):
            if isinstance(sub, (ast.expr, ast.stmt)) and getattr(sub, "lineno", None) is None:
                ast.copy_location(sub, old)
    return new


def _names_stored(nodes: list[ast.stmt]) -> set[str]:
    out = set()
    for n in nodes:
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                out.add(sub.id)
    return out


def _loads(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


# --- deferred effects (prints, warnings, logging) ---------------------------------------------------


def log_kind(call: ast.Call, ctx: Context) -> tuple[str, Any] | None:
    """("print" | "warn" | "log", details) if ``call`` is a print/warn/logging call we can defer."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    f = call.func
    if isinstance(f, ast.Name) and f.id == "print" and ctx.resolve(f) is print:
        if all((k.arg in ("sep", "end", "flush") and isinstance(k.value, ast.Constant))
               or (k.arg == "file" and ctx.is_global_expr(k.value)) for k in call.keywords):
            return "print", None
        return None
    target = ctx.resolve(f)
    if target is warnings.warn:
        kw = {k.arg: k.value for k in call.keywords}
        if set(kw) - {"category", "stacklevel"} or len(call.args) > 2 or not call.args:
            return None
        if "stacklevel" in kw and not (isinstance(kw["stacklevel"], ast.Constant) and kw["stacklevel"].value == 1):
            return None
        category = call.args[1] if len(call.args) > 1 else kw.get("category")
        if category is not None and not isinstance(ctx.resolve(category), type):
            return None
        return "warn", category
    if isinstance(f, ast.Attribute) and f.attr in LOG_METHODS and not call.keywords and call.args:
        owner = ctx.resolve(f.value)
        if isinstance(owner, logging.Logger) or owner is logging:
            return "log", rt._LEVELS[f.attr]
    return None


class _Args:
    """Splits a call's arguments into constant parts and the runtime values passed to ``deferred``."""

    def __init__(self, ctx: Context, converted: dict[str, str]) -> None:
        self.ctx, self.converted, self.values = ctx, converted, []

    def value(self, expr: ast.expr) -> tuple[Any, ...]:
        expr, converts = _strip_conversions(expr, self.ctx)
        if isinstance(expr, ast.Name) and expr.id in self.converted:
            converts = (self.converted[expr.id],) + converts
        if _is_shape(expr):
            expr, converts = _call("size_in", expr), ("size",) + converts  # a torch.Size leaves the graph as a tensor
        self.values.append(expr)
        return ("value", len(self.values) - 1, converts)

    def part(self, expr: ast.expr) -> tuple[Any, ...]:
        if isinstance(expr, ast.Constant):
            return ("const", expr.value)
        if isinstance(expr, ast.JoinedStr):
            pieces: list[Any] = []
            for v in expr.values:
                if isinstance(v, ast.Constant):
                    pieces.append(str(v.value))
                else:
                    assert isinstance(v, ast.FormattedValue)
                    _, index, convert = self.value(v.value)
                    conv = chr(v.conversion) if v.conversion not in (-1, None) else ""
                    spec = self.part(v.format_spec) if v.format_spec is not None else None
                    pieces.append((index, convert, conv, spec))
            return ("fstring", tuple(pieces))
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod) and isinstance(expr.left, ast.Constant) \
                and isinstance(expr.left.value, str):
            items = expr.right.elts if isinstance(expr.right, ast.Tuple) else [expr.right]
            return ("percent", expr.left.value, tuple(self.part(x) for x in items), isinstance(expr.right, ast.Tuple))
        return self.value(expr)


def _strip_conversions(expr: ast.expr, ctx: Context) -> tuple[ast.expr, tuple[str, ...]]:
    """``int(t.item())`` -> (``t``, ("item", "int")): conversions to Python values, applied after the graph."""
    converts: list[str] = []
    while isinstance(expr, ast.Call) and not expr.keywords:
        f = expr.func
        if isinstance(f, ast.Attribute) and f.attr in ("item", "tolist") and not expr.args:
            converts.insert(0, f.attr)
            expr = f.value
        elif len(expr.args) == 1 and not isinstance(expr.args[0], ast.Starred) and ctx.resolve(f) in (int, float, bool):
            converts.insert(0, ctx.resolve(f).__name__)
            expr = expr.args[0]
        else:
            break
    return expr, tuple(converts)


def _is_shape(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Attribute) and expr.attr == "shape") or (
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "size"
        and not expr.args and not expr.keywords)


def arg_purity(arg: ast.expr, ctx: Context, p: Purity) -> Purity:
    """Purity of a deferred log argument: its conversions (``.item()``, ``int()``) happen after the graph."""
    for leaf in _log_leaves(arg):
        purity(_strip_conversions(leaf, ctx)[0], ctx, p)
    return p


def defer(stmt: ast.Expr, ctx: Context, converted: dict[str, str], guard: tuple[str, int] | None = None) -> ast.stmt | None:
    """``_mend_rt.deferred(key, ...)`` standing for the print/warn/log statement ``stmt``, or None."""
    call = stmt.value
    assert isinstance(call, ast.Call)
    kind = log_kind(call, ctx)
    if kind is None:
        return None
    what, detail = kind
    a = _Args(ctx, converted)
    kwargs: tuple[tuple[str, Any], ...] = ()
    callee_expr = call.func
    if what == "warn":
        parts = (a.part(call.args[0]),) + ((("const", ctx.resolve(detail)),) if detail is not None else ())
    else:
        parts = tuple(a.part(x) for x in call.args)
        kwargs = tuple((k.arg, k.value.value if isinstance(k.value, ast.Constant) else rt.Lazy(_lazy(k.value, ctx)))
                       for k in call.keywords)
    values = a.values
    if guard is not None:
        values = [_name(guard[0])] + values
        parts = tuple(_shift(p) for p in parts)
    effect = rt.Effect(what, _lazy(callee_expr, ctx), ctx.globals, ctx.filename, stmt.lineno, ctx.funcname,
                       parts, kwargs, guarded=0 if guard is None else guard[1],
                       level=detail if what == "log" else 0)
    key = rt.register(effect)
    note = ctx.note(stmt, f"{ast.unparse(call.func)}(...) deferred until after the graph")
    return _at(ast.If(_call("fired", ast.Constant(note)), [ast.Expr(_call("deferred", ast.Constant(key), *values))], []),
               stmt)


def _shift(part: tuple[Any, ...]) -> tuple[Any, ...]:
    """Renumber a part's runtime values by one (a guard value goes first)."""
    if part[0] == "value":
        return ("value", part[1] + 1, part[2])
    if part[0] == "percent":
        return ("percent", part[1], tuple(_shift(p) for p in part[2]), part[3])
    if part[0] == "fstring":
        return ("fstring", tuple(p if isinstance(p, str) else (p[0] + 1, p[1], p[2], None if p[3] is None else _shift(p[3]))
                                 for p in part[1]))
    return part


def _lazy(expr: ast.expr, ctx: Context) -> Any:
    """A function of the globals that evaluates the global expression ``expr`` when the effect is replayed."""
    code = compile(ast.Expression(ast.fix_missing_locations(copy.deepcopy(expr))), ctx.filename, "eval")
    return lambda g: eval(code, g)  # noqa: S307 - the user's own expression, in the user's own globals


# --- purity -----------------------------------------------------------------------------------------


@dataclass
class Purity:
    ok: bool = True
    random: bool = False  # draws random numbers: must not run when its branch is not taken
    may_fail: bool = False  # can raise on some data (indexing, gather, linalg): same
    modules: list[ast.expr] = field(default_factory=list)  # self.x callables to check at run time

    def fail(self) -> Purity:
        self.ok = False
        return self


def purity(node: ast.AST, ctx: Context, p: Purity | None = None) -> Purity:
    """Whether evaluating expression ``node`` can have an effect besides its value (conservative)."""
    p = p or Purity()
    if not p.ok:
        return p
    if isinstance(node, (ast.Constant, ast.Name)):
        return p
    if isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Starred,
                         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return p.fail()
    if isinstance(node, ast.Attribute):
        return purity(node.value, ctx, p) if isinstance(node.ctx, ast.Load) else p.fail()
    if isinstance(node, ast.Subscript) and not _static_index(node.slice):
        p.may_fail = True  # x[i] / x[idx]: out of range raises
    if isinstance(node, ast.Call):
        for x in list(node.args) + [k.value for k in node.keywords]:
            purity(x, ctx, p)
        if any(k.arg in (None, "out") for k in node.keywords):
            return p.fail()
        return _call_purity(node, ctx, p)
    for child in ast.iter_child_nodes(node):
        purity(child, ctx, p)
    return p


def _call_purity(node: ast.Call, ctx: Context, p: Purity) -> Purity:
    f = node.func
    target = ctx.resolve(f)
    if target is not None:  # a global function: torch's or a builtin
        name = getattr(target, "__name__", "")
        if getattr(target, "__module__", "") == "builtins":
            return p if name in PURE_BUILTINS else p.fail()
        mod = getattr(target, "__module__", "") or ""
        if not (mod.startswith("torch") or isinstance(target, torch._ops.OpOverloadPacket)) or name.endswith("_"):
            return p.fail()
        p.random |= name in RANDOM
        p.may_fail |= name in MAY_FAIL
        return p
    if not isinstance(f, ast.Attribute):
        return p.fail()
    if _rooted_at_self(f, ctx):  # self.h(x): pure only if self.h is a known module (checked at run time)
        p.modules.append(f)
        return p
    purity(f.value, ctx, p)
    name = f.attr
    if name not in _TENSOR_ATTRS or name.startswith("_") or name.endswith("_") or name in CONTAINER_MUTATORS \
            or name in IMPURE_METHODS:
        return p.fail()
    p.random |= name in RANDOM
    p.may_fail |= name in MAY_FAIL
    return p


def _static_index(index: ast.expr) -> bool:
    """True for an index that cannot raise on any data: constants, ``None``, ``...`` and slices."""
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(i, ast.Slice) or (isinstance(i, ast.Constant) and i.value in (None, Ellipsis))
               for i in items)


def _rooted_at_self(f: ast.expr, ctx: Context) -> bool:
    while isinstance(f, ast.Attribute):
        f = f.value
    return isinstance(f, ast.Name) and f.id == ctx.self_name


def _maybe_tensor_test(test: ast.expr, ctx: Context) -> bool:
    """False for tests that are plainly Python values (shapes, None checks, flags): they are left alone."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, (ast.Name, ast.Attribute, ast.Constant, ast.BoolOp)):
        return False
    for n in ast.walk(test):
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim", "training", "dtype", "device", "is_cuda"):
            return False
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)):
            fname = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
            if fname in ("len", "isinstance", "hasattr", "callable", "size", "dim", "is_floating_point",
                         "is_complex", "numel", "getattr", "type"):
                return False
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for o in n.ops):
            return False
    return any(isinstance(n, (ast.Call, ast.Compare, ast.Subscript)) for n in ast.walk(test))


def _guard(p: str, pure: Purity) -> ast.expr:
    tests: list[ast.expr] = [_call("pred", _name(p))] + [_call("pure_module", copy.deepcopy(m)) for m in pure.modules]
    return tests[0] if len(tests) == 1 else ast.BoolOp(ast.And(), tests)


# --- the function-level pass ------------------------------------------------------------------------


def rewrite(fdef: ast.FunctionDef, ctx: Context) -> int:
    """Apply every rule to ``fdef`` in place; return how many rewrites fired (``ctx.notes`` lists them)."""
    a = fdef.args
    params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
    declared_global = {n for s in ast.walk(fdef) if isinstance(s, (ast.Global, ast.Nonlocal)) for n in s.names}
    ctx.locals = (set(params) | _names_stored(fdef.body)) - declared_global
    loads: dict[str, int] = {}
    for n in _loads(fdef):
        loads[n.id] = loads.get(n.id, 0) + 1
    block = _Block(ctx, loads)
    block.converted = _item_for_logging(fdef, ctx, block)
    fdef.body = block.stmts(fdef.body, set(params), top=True)
    return len(ctx.notes)


def _own_nodes(fdef: ast.FunctionDef) -> list[ast.AST]:
    """Every node of ``fdef``'s body outside nested functions, classes and lambdas."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fdef.body)
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _item_for_logging(fdef: ast.FunctionDef, ctx: Context, block: _Block) -> dict[str, str]:
    """Rule 2: ``m = t.item()`` where ``m`` is only logged (or unused) keeps ``m`` a tensor."""
    nodes = _own_nodes(fdef)
    log_args: set[int] = set()  # ids of the Name nodes that are arguments of deferrable logs
    for n in nodes:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and log_kind(n.value, ctx) is not None:
            for arg in n.value.args:
                leaves = [_strip_conversions(x, ctx)[0] for x in _log_leaves(arg)]
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
        uses = [x for x in _loads(fdef) if x.id == name]
        if all(id(x) in log_args for x in uses):
            converted[name] = v.func.attr  # applied before the log's own conversions
            n.value = v.func.value
            block.unused_items[id(n)] = not uses and v.func.attr == "item"
            block.item_notes[id(n)] = ctx.note(
                n, f".{v.func.attr}() of '{name}' kept as a tensor (only " + ("logged)" if uses else "computed, never used)"))
    return converted


def _log_leaves(arg: ast.expr) -> list[ast.expr]:
    """The expressions a log argument formats (what ``_Args.part`` passes as runtime values)."""
    if isinstance(arg, ast.JoinedStr):
        return [x for v in arg.values if isinstance(v, ast.FormattedValue) for x in _log_leaves(v.value)]
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mod) and isinstance(arg.left, ast.Constant) \
            and isinstance(arg.left.value, str):
        return [x for v in (arg.right.elts if isinstance(arg.right, ast.Tuple) else [arg.right]) for x in _log_leaves(v)]
    return [arg]


class _Block:
    """Rewrites statement lists (rules 1, 3 and 4); ``defined`` holds the names surely bound so far."""

    def __init__(self, ctx: Context, loads: dict[str, int]) -> None:
        self.ctx, self.loads = ctx, loads
        self.converted: dict[str, str] = {}
        self.unused_items: dict[int, bool] = {}
        self.item_notes: dict[int, int] = {}

    def stmts(self, body: list[ast.stmt], defined: set[str], top: bool = False) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for i, s in enumerate(body):
            rest = body[i + 1:]
            if (isinstance(s, ast.If) and not s.orelse and s.body and isinstance(s.body[-1], ast.Return)
                    and rest and isinstance(rest[-1], ast.Return) and _maybe_tensor_test(s.test, self.ctx)):
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
                check = _at(ast.Expr(_call("deferred", ast.Constant(key), copy.deepcopy(s.targets[0]))), s)
                check.value.args[1].ctx = ast.Load()
                new.append(check)
            return new
        if isinstance(s, ast.If):
            if _maybe_tensor_test(s.test, self.ctx):
                new = self.if_convert(s, defined)
                if new is not None:
                    return new
            s.body = self.stmts(s.body, set(defined))
            s.orelse = self.stmts(s.orelse, set(defined))
            return [s]
        if isinstance(s, (ast.For, ast.AsyncFor)):
            s.body = self.stmts(s.body, set(defined) | _names_stored([ast.Assign([s.target], ast.Constant(0))]))
            s.orelse = self.stmts(s.orelse, set(defined))
        elif isinstance(s, ast.While):
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
            call.args[skip:] = [_at(_call("snap", v), s) for v in call.args[skip:]]
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
        if not _maybe_tensor_test(test, self.ctx) or not isinstance(self.ctx.resolve(exc), type):
            return None
        pure = Purity()
        for x in args:
            arg_purity(x, self.ctx, pure)
        _pure_stmts(rest, self.ctx, pure)
        if not pure.ok or pure.random or pure.may_fail:
            return None  # the rest would run before the check raises: it must not draw numbers or raise
        c = self.ctx.fresh("c")
        a = _Args(self.ctx, self.converted)
        parts = (("value", 0, ()),) + tuple(_shift(a.part(x)) for x in args)
        key = rt.register(rt.Effect("check", _lazy(exc, self.ctx), self.ctx.globals, self.ctx.filename, s.lineno,
                                    self.ctx.funcname, parts, extra={"raise_if": raise_if}))
        what = "assert" if isinstance(s, ast.Assert) else f"raise {ast.unparse(exc)}"
        note = self.ctx.note(s, f"{what} on a tensor -> checked after the graph")
        deferred = ast.Expr(_call("deferred", ast.Constant(key), _name(c), *a.values))
        original = copy.deepcopy(s)
        if isinstance(original, ast.Assert):
            original.test = _name(c)
        else:
            original.test = _name(c) if raise_if else ast.UnaryOp(ast.Not(), _name(c))
        new: list[ast.stmt] = [ast.Assign([_name(c, True)], test),
                               ast.If(_guard(c, pure), [_fired(note, s), deferred], [original])]
        if isinstance(s, ast.Assert):
            new = [ast.If(_name("__debug__"), new, [])]
        return _at(new, s)

    # --- rule 4: tensor if/else -------------------------------------------------------------------

    def if_convert(self, s: ast.If, defined: set[str], early: bool = False) -> list[ast.stmt] | None:
        T, F = s.body, s.orelse
        returns = bool(T) and isinstance(T[-1], ast.Return)
        if returns != (bool(F) and isinstance(F[-1], ast.Return)):
            return None
        pure = Purity()
        logs = False
        for branch in (T, F):
            for j, st in enumerate(branch):
                if isinstance(st, ast.Pass):
                    continue
                if isinstance(st, ast.Return) and j == len(branch) - 1 and st.value is not None:
                    purity(st.value, self.ctx, pure)
                elif isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain_target(st.targets[0]):
                    purity(st.value, self.ctx, pure)
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
            st_t, st_f = _names_stored(T), _names_stored(F)
            outputs = []
            inside = {}
            for n in _loads(s):
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
        tt = ast.Tuple([_name(x) for x in t_outs], ast.Load())
        ff = ast.Tuple([_name(x) for x in f_outs], ast.Load())

        def assign(value: ast.expr) -> ast.stmt:
            if returns:
                return ast.Return(ast.Subscript(value, ast.Constant(0), ast.Load()))
            return ast.Assign([ast.Tuple([_name(x, True) for x in outputs], ast.Store())], value)

        fns: list[ast.stmt] = []
        if not logs:
            for name, body, outs in ((f"_mend_tfn{k}", t_body, tt), (f"_mend_ffn{k}", f_body, ff)):
                fns.append(ast.FunctionDef(name, ast.arguments([], [], None, [], [], None, []),
                                           copy.deepcopy(body) + [ast.Return(copy.deepcopy(outs))], [], None,
                                           **_TYPE_PARAMS))
            early_txt = "early return " if early else ""
            use_cond = [_fired(self.ctx.note(s, f"{early_txt}if on a tensor -> torch.cond"), s),
                        assign(_call("cond", _name(p), _name(f"_mend_tfn{k}"), _name(f"_mend_ffn{k}")))]
        select = [assign(ast.IfExp(_name(p), copy.deepcopy(tt), copy.deepcopy(ff)))]
        if not speculate:
            fast = fns + use_cond
        else:
            fallback = ast.If(_call("cond_ok", _name(p), copy.deepcopy(tt), copy.deepcopy(ff)), fns + use_cond, select) \
                if not logs else select[0]
            where = self.ctx.note(s, ("early return " if early else "") + "if on a tensor -> torch.where")
            fast = t_body + f_body + [ast.If(_call("mergeable", _name(p), tt, ff),
                                             [_fired(where, s), assign(_call("merge", _name(p), copy.deepcopy(tt), copy.deepcopy(ff)))],
                                             [fallback])]
        original = ast.If(_name(p), self.stmts(copy.deepcopy(T), set(defined)), self.stmts(copy.deepcopy(F), set(defined)))
        new = [ast.Assign([_name(p, True)], s.test), ast.If(_guard(p, pure), fast, [original])]
        return _at(new, s)

    def branch(self, body: list[ast.stmt], prefix: str, outputs: list[str], guard: tuple[str, int]) -> tuple[list[ast.stmt], list[str]]:
        """The branch's statements with every name it binds renamed (so both branches can run), and its outputs."""
        renames: dict[str, str] = {}
        out: list[ast.stmt] = []
        for st in body:
            st = copy.deepcopy(st)
            if isinstance(st, ast.Pass):
                continue
            value_holder = st
            for n in ast.walk(value_holder.value if not isinstance(st, ast.Expr) else st):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in renames:
                    n.id = renames[n.id]
            if isinstance(st, ast.Return):
                renames["_mend_ret"] = prefix + "ret"
                out.append(_at(ast.Assign([_name(prefix + "ret", True)], st.value), st))
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


def _fired(note: int, at: ast.AST) -> ast.stmt:
    return _at(ast.Expr(_call("fired", ast.Constant(note))), at)


def _plain_target(t: ast.expr) -> bool:
    if isinstance(t, ast.Name):
        return True
    return isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts)


def _bound_by(s: ast.stmt) -> set[str]:
    if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return _names_stored([s])
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
