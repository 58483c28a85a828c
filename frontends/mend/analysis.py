"""What the mend pass knows about a function's source: names, purity, and AST helpers.

- :class:`Context`: the function being rewritten (its file, globals, locals) and the rewrites noted
  so far; ``resolve`` says what a global dotted name means *now*, following attributes only on
  modules and classes so that no user property runs.
- :func:`purity`: whether evaluating an expression can have an effect besides its value. Calls are
  pure when they are torch functions or Tensor methods that change nothing in place; ``self.<m>(...)``
  calls are recorded and checked at run time (``runtime.pure_module``). Two further flags say
  when an expression must not run speculatively (both branches of an if): it draws random numbers
  (``random``) or can raise on some data (``may_fail``: indexing, gather, linalg, a size computed
  from the data: ``torch.zeros(n, self.size - length)`` raises where the branch not taken makes it negative).
"""

from __future__ import annotations

import ast
import builtins
import copy
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import runtime as rt

RT = "_mend_rt"  # the free variable through which mended code reaches the runtime helpers
TYPE_PARAMS: dict[str, Any] = {"type_params": []} if sys.version_info >= (3, 12) else {}  # for new FunctionDefs

#: functions that draw random numbers (by name, under torch, torch.nn.functional, Tensor)
RANDOM = {
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "randint_like",
    "bernoulli",
    "multinomial",
    "normal",
    "poisson",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
    "rrelu",
    "gumbel_softmax",
    "native_dropout",
}
#: functions that raise on some data (indices out of range, singular matrices, bad targets)
MAY_FAIL = {
    "gather",
    "index_select",
    "take",
    "take_along_dim",
    "embedding",
    "embedding_bag",
    "one_hot",
    "bincount",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_add",
    "index_copy",
    "index_fill",
    "index_put",
    "cholesky",
    "cholesky_inverse",
    "inverse",
    "inv",
    "solve",
    "lu",
    "lu_factor",
    "lu_solve",
    "triangular_solve",
    "nll_loss",
    "cross_entropy",
    "multi_margin_loss",
    "ctc_loss",
    "item",
    "repeat_interleave",
    "unflatten",
}
#: functions and methods that take sizes: with a size computed from the data (``torch.zeros(n, self.size -
#: length)``) they raise where it comes out negative, which a branch not taken may well compute
SIZED = {
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "expand",
    "narrow",
    "repeat",
    "tile",
}
#: keyword arguments of those that are not sizes
_NOT_SIZES = {"dtype", "device", "layout", "requires_grad", "pin_memory", "memory_format", "generator", "fill_value"}
#: method names that mutate a Python container (a receiver we cannot type could be one)
CONTAINER_MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "sort",
    "reverse",
    "popitem",
    "put",
}
#: Tensor methods with an effect outside the value they return
IMPURE_METHODS = {
    "item",
    "tolist",
    "numpy",
    "backward",
    "register_hook",
    "retain_grad",
    "record_stream",
    "share_memory_",
    "data_ptr",
    "storage",
    "untyped_storage",
}
#: builtins that are pure on any argument we let through
PURE_BUILTINS = {
    "abs",
    "min",
    "max",
    "float",
    "int",
    "bool",
    "round",
    "pow",
    "len",
    "tuple",
    "range",
    "isinstance",
    "divmod",
}
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
    module_names: set[str] = field(default_factory=set)  # local names a rule vouches are modules it checks
    attr_dicts: frozenset[str] = frozenset()  # self.<name> that hold attribute dicts (:mod:`.attrs`)
    held_functions: dict[str, Any] = field(default_factory=dict)  # self.<name> that hold the user's functions
    data_sized: set[str] = field(default_factory=set)  # names of selections whose size is data
    injected: dict[str, Any] = field(default_factory=dict)  # objects the rewritten code reads by these names
    export: bool = False  # mended for torch.export (inference only): its own rules apply too

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"_mend_{stem}{self.counter}"

    def note(self, node: ast.AST, text: str, wide: bool = False) -> int:
        """Register a rewrite ("file:line: what"); the code emitted for it calls ``fired(key)`` when traced.
        ``wide``: the rewritten code gives a value of another kind than the user's (read after ``node``)."""
        first = getattr(node, "lineno", 0)
        key = rt.note(f"{self.filename}:{first}: {text}")
        rt.SPANS[key] = (self.filename, first, getattr(node, "end_lineno", None) or first, wide)
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


class Walker:
    """The statement walker as the rule mixins (``CheckRules``, ``BranchRules``, ``LoopRules``) see it.

    :class:`~.statements.Block` is the one class that mixes them in; it sets these attributes and defines
    ``stmts`` and ``branch``, which the rules call back (declared here for the type checker only).
    """

    ctx: Context
    loads: dict[str, int]  # how often each name is read in the whole function
    converted: dict[str, str]
    from_data: set[str]

    if TYPE_CHECKING:

        def stmts(self, body: list[ast.stmt], defined: set[str], top: bool = False) -> list[ast.stmt]: ...

        def branch(
            self, body: list[ast.stmt], prefix: str, outputs: list[str], guard: tuple[str, int]
        ) -> tuple[list[ast.stmt], list[str]]: ...

        def nested_ok(self, s: ast.If, pure: Purity, bound: set[str]) -> bool: ...

        def straight_body(self, body: list[ast.stmt], pure: Purity, bound: set[str]) -> bool: ...


def rt_call(func: str, *args: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), func, ast.Load()), list(args), [])


def name_node(id: str, store: bool = False) -> ast.Name:
    return ast.Name(id, ast.Store() if store else ast.Load())


def located(new: Any, old: ast.AST) -> Any:
    """Place the generated nodes of ``new`` (those without a location) at the start of ``old``'s line.

    One line, not ``old``'s whole span: CPython places a method call at its attribute's *end*, so a
    span ending lines later would move the instruction to the wrong line.
    """
    line, col = getattr(old, "lineno", 1), getattr(old, "col_offset", 0)
    for n in new if isinstance(new, list) else [new]:
        for sub in ast.walk(n):
            if isinstance(sub, (ast.expr, ast.stmt)) and getattr(sub, "lineno", None) is None:
                sub.lineno, sub.col_offset, sub.end_lineno, sub.end_col_offset = line, col, line, col
    return new


def names_stored(nodes: list[ast.stmt]) -> set[str]:
    out = set()
    for n in nodes:
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                out.add(sub.id)
    return out


def loaded_names(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


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
    if isinstance(node, ast.Call) and rt_name(node) in LAZY_RT:  # our own thunks: their bodies are what runs
        for x in node.args:
            purity(x.body if isinstance(x, ast.Lambda) else x, ctx, p)
        return p
    if isinstance(
        node,
        (
            ast.Lambda,
            ast.NamedExpr,
            ast.Await,
            ast.Yield,
            ast.YieldFrom,
            ast.Starred,
            ast.ListComp,
            ast.SetComp,
            ast.DictComp,
            ast.GeneratorExp,
        ),
    ):
        return p.fail()
    if isinstance(node, ast.Attribute):
        return purity(node.value, ctx, p) if isinstance(node.ctx, ast.Load) else p.fail()
    if isinstance(node, ast.Subscript) and not static_index(node.slice):
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


#: runtime helpers the rewrites put into expressions that are then analysed like user code
PURE_RT = {"exact", "not_", "variable", "data_test", "attr"}
#: runtime helpers that take thunks (``lambda: <user expression>``): the thunks' bodies are analysed
LAZY_RT = {"all_", "any_", "choose"}


def rt_name(node: ast.Call) -> str | None:
    """``"f"`` for a call ``_mend_rt.f(...)`` that a rewrite emitted, else None."""
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == RT:
        return f.attr
    return None


def _computed_sizes(node: ast.Call) -> bool:
    """Whether a call of a :data:`SIZED` function passes a size that is not a literal (``-1`` included)."""

    def literal(x: ast.expr) -> bool:
        if isinstance(x, (ast.Tuple, ast.List)):
            return all(literal(e) for e in x.elts)
        if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub):
            return literal(x.operand)
        return isinstance(x, ast.Constant)

    sizes = list(node.args) + [k.value for k in node.keywords if k.arg not in _NOT_SIZES]
    return not all(literal(x) for x in sizes)


def _call_purity(node: ast.Call, ctx: Context, p: Purity) -> Purity:
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == RT:
        return p if f.attr in PURE_RT else p.fail()
    target = ctx.resolve(f)
    if target is not None:  # a global function: torch's or a builtin
        name = getattr(target, "__name__", "")
        if getattr(target, "__module__", "") == "builtins":
            return p if name in PURE_BUILTINS else p.fail()
        mod = getattr(target, "__module__", "") or ""
        if not (mod.startswith("torch") or isinstance(target, torch._ops.OpOverloadPacket)) or name.endswith("_"):
            return p.fail()
        p.random |= name in RANDOM
        p.may_fail |= name in MAY_FAIL or (name in SIZED and _computed_sizes(node))
        return p
    if isinstance(f, ast.Name) and f.id in ctx.module_names:  # a loop over layers calling each: checked at run time
        p.modules.append(f)
        return p
    if not isinstance(f, ast.Attribute):
        return p.fail()
    if rooted_at_self(f, ctx):  # self.h(x): pure only if self.h is a known module (checked at run time)
        p.modules.append(f)
        return p
    purity(f.value, ctx, p)
    name = f.attr
    if (
        name not in _TENSOR_ATTRS
        or name.startswith("_")
        or name.endswith("_")
        or name in CONTAINER_MUTATORS
        or name in IMPURE_METHODS
    ):
        return p.fail()
    p.random |= name in RANDOM
    p.may_fail |= name in MAY_FAIL or (name in SIZED and _computed_sizes(node))
    return p


def pure_forward(fdef: ast.FunctionDef, ctx: Context) -> tuple[str, ...] | None:
    """The ``self.<name>`` modules a user ``forward`` calls, if its body is only assignments to names and
    a ``return``, of values with no side effect, drawing no random numbers and raising on no data; else
    None. ``runtime.pure_module`` then vouches for the module if each of those is pure too."""
    body = fdef.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    p = Purity()
    for st in body[:-1]:
        if not (isinstance(st, ast.Assign) and all(isinstance(t, ast.Name) for t in st.targets)):
            return None
        purity(st.value, ctx, p)
    purity(body[-1].value, ctx, p)
    if not p.ok or p.random or p.may_fail:
        return None
    names = []
    for m in p.modules:
        if not (isinstance(m, ast.Attribute) and isinstance(m.value, ast.Name) and m.value.id == ctx.self_name):
            return None
        names.append(m.attr)
    return tuple(dict.fromkeys(names))


def static_index(index: ast.expr) -> bool:
    """True for an index that cannot raise on any data: constants, ``None``, ``...`` and slices."""
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(i, ast.Slice) or (isinstance(i, ast.Constant) and i.value in (None, Ellipsis)) for i in items)


def rooted_at_self(f: ast.expr, ctx: Context) -> bool:
    while isinstance(f, ast.Attribute):
        f = f.value
    return isinstance(f, ast.Name) and f.id == ctx.self_name


def maybe_tensor_test(test: ast.expr, ctx: Context) -> bool:
    """False for tests that are plainly Python values (shapes, None checks, flags): they are left alone."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.BoolOp):
        return boolop_ok(test, ctx)
    if isinstance(test, (ast.Name, ast.Attribute, ast.Constant)):
        return False
    for n in ast.walk(test):
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim", "training", "dtype", "device", "is_cuda"):
            if not (n.attr == "shape" and _data_sized(n.value, ctx)):
                return False
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)):
            fname = n.func.id if isinstance(n.func, ast.Name) else n.func.attr
            if fname in ("size", "numel") and isinstance(n.func, ast.Attribute) and _data_sized(n.func.value, ctx):
                continue  # the size of a boolean-mask selection is tensor data
            if fname in (
                "len",
                "isinstance",
                "hasattr",
                "callable",
                "size",
                "dim",
                "is_floating_point",
                "is_complex",
                "numel",
                "getattr",
                "type",
            ):
                return False
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for o in n.ops):
            return False
    return any(isinstance(n, (ast.Call, ast.Compare, ast.Subscript)) for n in ast.walk(test))


def _data_sized(e: ast.expr, ctx: Context) -> bool:
    return isinstance(e, ast.Name) and e.id in ctx.data_sized


#: methods whose result's size depends on the tensor's values
_DATA_SIZED_CALLS = {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"}


def data_sized_names(fdef: ast.FunctionDef) -> set[str]:
    """Names assigned once, from a selection whose size depends on data (``x[x > 0]``, ``x.nonzero()``)."""
    stores: dict[str, int] = {}
    for n in ast.walk(fdef):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            stores[n.id] = stores.get(n.id, 0) + 1
    out = set()
    for s in ast.walk(fdef):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
            continue
        v = s.value
        masked = isinstance(v, ast.Subscript) and (
            isinstance(v.slice, (ast.Compare, ast.BoolOp))
            or (isinstance(v.slice, ast.BinOp) and isinstance(v.slice.op, (ast.BitAnd, ast.BitOr)))
            or (isinstance(v.slice, ast.UnaryOp) and isinstance(v.slice.op, ast.Invert))
        )
        called = isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _DATA_SIZED_CALLS
        if (masked or called) and stores.get(s.targets[0].id) == 1:
            out.add(s.targets[0].id)
    return out


def boolop_ok(test: ast.BoolOp, ctx: Context) -> bool:
    """Whether ``a and b`` / ``a or b`` in a test can be a tensor test (``runtime.all_`` / ``any_``): some
    operand is a tensor test, and every operand after the first such one may run although Python would
    have stopped before it (side-effect free, draws no random numbers, cannot raise on some data)."""
    first = next((i for i, v in enumerate(test.values) if maybe_tensor_test(v, ctx)), None)
    if first is None:
        return False
    later = Purity()
    for v in test.values[first + 1 :]:
        purity(exact_items(v), ctx, later)
    return later.ok and not (later.random or later.may_fail or later.modules)


def exact_items(test: ast.expr) -> ast.expr:
    """``test`` as an expression the graph can keep: ``not t`` as ``_mend_rt.not_(t)``, and
    ``<x>.item()`` as ``_mend_rt.exact(<x>)`` where it is an operand of a comparison,
    or of ``+``, ``-``, ``*`` or unary minus leading to one: a floating one-element tensor stays in the
    graph as float64, which holds its value exactly, and float64 ``+ - *`` and comparisons are what
    Python's floats do. Elsewhere (a call such as ``round(x.item(), 2)``, a division that Python would
    raise on) ``.item()`` stays as written."""

    def numeric(e: ast.expr) -> ast.expr:
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr == "item"
            and not e.args
            and not e.keywords
        ):
            return ast.copy_location(rt_call("exact", e.func.value), e)
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult)):
            return ast.copy_location(ast.BinOp(numeric(e.left), e.op, numeric(e.right)), e)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            return ast.copy_location(ast.UnaryOp(e.op, numeric(e.operand)), e)
        return e

    test = copy.deepcopy(test)
    if isinstance(test, ast.BoolOp):  # `a and b`: each operand a thunk, so Python's short circuit still holds
        thunks = [ast.Lambda(ast.arguments([], [], None, [], [], None, []), exact_items(v)) for v in test.values]
        return ast.copy_location(rt_call("all_" if isinstance(test.op, ast.And) else "any_", *thunks), test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):  # `not t` would ask Python for bool(t)
        return ast.copy_location(rt_call("not_", exact_items(test.operand)), test)
    if isinstance(test, ast.Compare):
        test = ast.copy_location(
            ast.Compare(numeric(test.left), test.ops, [numeric(c) for c in test.comparators]), test
        )
    return ast.copy_location(rt_call("data_test", test), test)  # a symbolic bool becomes a tensor test


def guard_test(p: str, pure: Purity) -> ast.expr:
    tests: list[ast.expr] = [
        rt_call("pred", name_node(p)),
        *(rt_call("pure_module", copy.deepcopy(m)) for m in pure.modules),
    ]
    return tests[0] if len(tests) == 1 else ast.BoolOp(ast.And(), tests)


def fired_stmt(note: int, at: ast.AST) -> ast.stmt:
    return located(ast.Expr(rt_call("fired", ast.Constant(note))), at)


def plain_target(t: ast.expr) -> bool:
    if isinstance(t, ast.Name):
        return True
    return isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts)
