"""Numbers read from data in Python: ``.item()`` / ``.tolist()`` only logged, and ``random.randint``.

``m = t.item()`` where every later read of ``m`` is an argument of a print/warn/log that
:mod:`.effects` defers keeps ``m`` the tensor ``t``; the conversion is applied when the log is replayed
after the graph. A ``.item()`` never read at all is still performed after the graph (it raises what it
would raise). :func:`reads_item` tells the loop rules which trip counts come from tensor data.

``n = random.randint(a, b)``: Dynamo draws the number as a tensor and reads it back as a size it knows
nothing of, so a later test on a shape cut with it (``x[:, n:]`` shorter than ``k``?) breaks the graph.
:func:`drawn_range` binds ``a`` and ``b`` once and has ``runtime.drawn`` tell Dynamo ``a <= n <= b``
(``torch._check``): tests that range decides then need no branch (a random crop's padding test).

``np.prod(x.size()[1:])``, ``np.prod(self.shape)``, ``int(np.prod(np.array(x.size()[2:])))``: NumPy's
product of a shape (a flatten's width, a VQ-VAE's latent count). Dynamo runs NumPy calls as tensor ops,
so the product leaves as a number read back from a tensor, unknown to it: a break where it is used
("data dependent operator"), and with ``.item()`` kept in the graph (``switches``) a size of a view
Dynamo cannot finish the frame with (the whole frame then runs eagerly). :func:`size_products` makes
such a call ``runtime.size_prod(note, <shape>, <np.array?>)``: while Dynamo traces a shape (a
``torch.Size``, or a tuple or list of ints), the product of its sizes as Python computes it (an int,
symbolic where a size is); NumPy's call as written otherwise (an ``np.int64``, or ``1.0`` for no sizes).

``np.mgrid[-r:r + 1, -r:r + 1]``, ``np.ogrid[0:h, 0:w]``: NumPy's index grids (a Gaussian window's
coordinates, an SSIM loss's or a Laplacian pyramid's kernel built in ``forward``). Dynamo skips NumPy's
``nd_grid.__getitem__``, a break before the arithmetic it otherwise traces as tensor ops; the same grid
is ``np.arange`` per axis joined by ``np.meshgrid(..., indexing="ij")``, which it traces.
:func:`numpy_grids` makes such a subscript (slices only) ``runtime.grid(note, <grid>, ((start, stop,
step), ...), <a tuple?>)``: while Dynamo traces and every bound is a Python number, that construction
(a complex step, NumPy's "this many points", is ``np.linspace``); the subscript as written otherwise.
"""

from __future__ import annotations

import ast
import random
from typing import TYPE_CHECKING, Any

from .analysis import RT, Context, fired_stmt, loaded_names, located, name_node, rt_call
from .effects import log_kind, log_leaves, strip_conversions

if TYPE_CHECKING:
    from .statements import Block

try:
    import numpy

    _NP_PROD: Any = numpy.prod
    _NP_ARRAY: Any = numpy.array
    _NP_GRIDS: tuple[Any, ...] = (numpy.mgrid, numpy.ogrid)
except ImportError:  # no NumPy: no np.prod or np.mgrid to find
    _NP_PROD = _NP_ARRAY = object()
    _NP_GRIDS = ()


def own_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements ``Block`` visits: nested in if/for/while/with/try, not in functions, classes or match."""
    out: list[ast.stmt] = []
    for s in body:
        out.append(s)
        if isinstance(s, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            for field_name in ("body", "orelse", "finalbody"):
                out += own_statements(getattr(s, field_name, []))
            for h in getattr(s, "handlers", []):
                out += own_statements(h.body)
    return out


def item_for_logging(fdef: ast.FunctionDef, ctx: Context, block: Block) -> dict[str, str]:
    """``m = t.item()`` where ``m`` is only logged (or unused) keeps ``m`` a tensor."""
    nodes = own_statements(fdef.body)
    log_args: set[int] = set()  # ids of the Name nodes that are arguments of deferrable logs
    for n in nodes:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and log_kind(n.value, ctx) is not None:
            for arg in n.value.args:
                leaves = [strip_conversions(x, ctx)[0] for x in log_leaves(arg)]
                log_args.update(id(x) for x in leaves if isinstance(x, ast.Name))
    stores: dict[str, int] = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores[node.id] = stores.get(node.id, 0) + 1
    converted: dict[str, str] = {}
    for n in nodes:
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
            continue
        v, name = n.value, n.targets[0].id
        if (
            not (
                isinstance(v, ast.Call)
                and isinstance(v.func, ast.Attribute)
                and v.func.attr in ("item", "tolist")
                and not v.args
                and not v.keywords
            )
            or stores.get(name) != 1
        ):
            continue
        uses = [x for x in loaded_names(fdef) if x.id == name]
        if all(id(x) in log_args for x in uses):
            converted[name] = v.func.attr  # applied before the log's own conversions
            n.value = v.func.value
            block.unused_items[id(n)] = not uses and v.func.attr == "item"
            block.item_notes[id(n)] = ctx.note(
                n,
                f".{v.func.attr}() of '{name}' kept as a tensor (only "
                + ("logged)" if uses else "computed, never used)"),
            )
    return converted


def reads_item(e: ast.AST) -> bool:
    return any(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("item", "tolist")
        for c in ast.walk(e)
    )


def drawn_range(s: ast.stmt, ctx: Context) -> list[ast.stmt] | None:
    """``n = random.randint(a, b)`` -> ``lo, hi = a, b; n = runtime.drawn(random.randint(lo, hi), lo, hi)``."""
    if not (
        isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and isinstance(s.value, ast.Call)
        and len(s.value.args) == 2
        and not s.value.keywords
        and not any(isinstance(a, ast.Starred) for a in s.value.args)
        and ctx.resolve(s.value.func) is random.randint
    ):
        return None
    bounds = [ctx.fresh("lo"), ctx.fresh("hi")]
    note = ctx.note(s, "random.randint(a, b) -> a size Dynamo knows lies in [a, b] (torch._check)")
    call = ast.Call(s.value.func, [name_node(b) for b in bounds], [])
    out: list[ast.stmt] = [ast.Assign([name_node(b, store=True)], a) for b, a in zip(bounds, s.value.args)]
    out.append(ast.Assign(s.targets, rt_call("drawn", call, *(name_node(b) for b in bounds))))
    out.append(fired_stmt(note, s))
    return [located(x, s) for x in out]


def size_products(fdef: ast.FunctionDef, ctx: Context) -> None:
    """``np.prod(<v>)`` and ``np.prod(np.array(<v>))`` (one argument, no keywords) ->
    ``runtime.size_prod(note, <v>, <whether np.array>)``, in place."""
    for call in [n for n in ast.walk(fdef) if isinstance(n, ast.Call)]:
        if not _one_argument(call) or ctx.resolve(call.func) is not _NP_PROD:
            continue
        value, array = call.args[0], False
        if isinstance(value, ast.Call) and _one_argument(value) and ctx.resolve(value.func) is _NP_ARRAY:
            value, array = value.args[0], True
        # an int where NumPy gives an np.int64: a value of another kind, read after the statement
        note = ctx.note(call, "np.prod(<a shape>) -> the product of its sizes, a number Dynamo knows", wide=True)
        call.func = located(
            ast.copy_location(ast.Attribute(ast.Name(RT, ast.Load()), "size_prod", ast.Load()), call), call
        )
        call.args = [located(ast.Constant(note), call), value, located(ast.Constant(array), call)]


def numpy_grids(fdef: ast.FunctionDef, ctx: Context) -> None:
    """``np.mgrid[<slices>]`` / ``np.ogrid[<slices>]`` ->
    ``runtime.grid(note, <grid>, ((start, stop, step), ...), <a tuple?>, <ogrid?>)``."""

    class Grids(ast.NodeTransformer):
        def visit_Subscript(self, node: ast.Subscript) -> ast.expr:
            self.generic_visit(node)
            grid = ctx.resolve(node.value)
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            slices = [p for p in parts if isinstance(p, ast.Slice)]
            if not any(grid is g for g in _NP_GRIDS) or len(slices) != len(parts):
                return node
            sparse = grid is not _NP_GRIDS[0]
            name = "np.ogrid" if sparse else "np.mgrid"
            note = ctx.note(node, f"{name}[...] -> np.arange and np.meshgrid, which Dynamo traces")
            bounds: list[ast.expr] = [
                ast.Tuple([b if b is not None else ast.Constant(None) for b in (p.lower, p.upper, p.step)], ast.Load())
                for p in slices
            ]
            several = isinstance(node.slice, ast.Tuple)
            args = [ast.Constant(note), node.value, ast.Tuple(bounds, ast.Load()), ast.Constant(several)]
            call = rt_call("grid", *args, ast.Constant(sparse))
            return located(ast.copy_location(call, node), node)

    Grids().visit(fdef)


def _one_argument(call: ast.Call) -> bool:
    return len(call.args) == 1 and not call.keywords and not isinstance(call.args[0], ast.Starred)
