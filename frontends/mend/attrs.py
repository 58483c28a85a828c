"""Attribute dicts: ``cfg.scale`` where ``cfg``'s class is a ``dict`` with ``__getattr__ = dict.__getitem__``.

Research code keeps its configuration in a dict subclass read by attribute (``class AttrDict(dict):
__getattr__ = dict.__getitem__``, or ``= dict.get``). Dynamo refuses a ``__getattr__`` that is not a
Python function and skips the whole frame. An attribute read whose receiver is such a dict becomes
``_mend_rt.attr(note, receiver, "name")``, which while Dynamo traces reads ``receiver["name"]`` (or
``receiver.get("name")``) as Python's lookup would end up doing, and is ``getattr`` otherwise.

Receivers, known from the objects at mend time (the rule does not guess from names):

- ``self.<a>`` where the module instance holds an attribute dict in ``a`` (:func:`held_by`), and a
  local bound once from it (``cfg = self.cfg``);
- a global name bound to an attribute dict now (checked again at run time: rebinding it is fine);
- an attribute read of a rewritten receiver (``self.cfg.model.hidden``: nested attribute dicts).

Method calls (``cfg.get(...)``, ``cfg.items()``) and stores are left as written.
"""

from __future__ import annotations

import ast
from typing import Any

from .analysis import RT, Context, located, rt_call


def is_attr_dict(value: Any) -> bool:
    """A dict whose class reads missing attributes from its items (a C ``__getattr__`` from dict)."""
    return isinstance(value, dict) and getattr(type(value), "__getattr__", None) in (dict.__getitem__, dict.get)


def held_by(module: Any) -> frozenset[str]:
    """The instance attributes of ``module`` that hold attribute dicts."""
    return frozenset(k for k, v in vars(module).items() if is_attr_dict(v))


class _Reads(ast.NodeTransformer):
    def __init__(self, ctx: Context, aliases: set[str]) -> None:
        self.ctx, self.aliases = ctx, aliases

    def _receiver(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == self.ctx.self_name:
            return e.attr in self.ctx.attr_dicts
        if isinstance(e, ast.Name):
            return e.id in self.aliases or (e.id not in self.ctx.locals and is_attr_dict(self.ctx.globals.get(e.id)))
        return (  # a rewritten read: nested attribute dicts
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and isinstance(e.func.value, ast.Name)
            and e.func.value.id == RT
            and e.func.attr == "attr"
        )

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load) or not self._receiver(node.value):
            return node
        note = self.ctx.note(node, f"attribute dict read .{node.attr} -> [{node.attr!r}]")
        return located(
            ast.copy_location(rt_call("attr", ast.Constant(note), node.value, ast.Constant(node.attr)), node), node
        )

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if isinstance(node.func, ast.Attribute):  # a method call on the receiver stays a method call
            node.func.value = self.visit(node.func.value)
        else:
            node.func = self.visit(node.func)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        return node


def attribute_dicts(fdef: ast.FunctionDef, ctx: Context) -> None:
    """Rewrite the attribute reads of ``fdef`` whose receiver is an attribute dict, in place."""
    stores: dict[str, list[ast.AST]] = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            stores.setdefault(node.id, []).append(node)
    params = {a.arg for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs}
    aliases = {
        s.targets[0].id
        for s in ast.walk(fdef)
        if isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and len(stores.get(s.targets[0].id, [])) == 1
        and s.targets[0].id not in params
        and isinstance(s.value, ast.Attribute)
        and isinstance(s.value.value, ast.Name)
        and s.value.value.id == ctx.self_name
        and s.value.attr in ctx.attr_dicts
    }
    if not (aliases or ctx.attr_dicts or any(is_attr_dict(v) for v in ctx.globals.values())):
        return
    reads = _Reads(ctx, aliases)
    for i, s in enumerate(fdef.body):
        fdef.body[i] = reads.visit(s)
