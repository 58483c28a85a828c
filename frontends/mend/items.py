"""``.item()`` / ``.tolist()`` whose Python value is only logged (or never used): kept a tensor.

``m = t.item()`` where every later read of ``m`` is an argument of a print/warn/log that
:mod:`.effects` defers keeps ``m`` the tensor ``t``; the conversion is applied when the log is replayed
after the graph. A ``.item()`` never read at all is still performed after the graph (it raises what it
would raise). :func:`reads_item` tells the loop rules which trip counts come from tensor data.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from .analysis import Context, loaded_names
from .effects import log_kind, log_leaves, strip_conversions

if TYPE_CHECKING:
    from .statements import Block


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
