"""Symbolic graphs for backends that import through ``torch.export`` (ONNX Runtime, TVM).

A symbolic graph (core/ir.py, "Symbolic dimensions") takes each symbol's value as an integer input as
well as in the tensors' sizes. An exported program with dynamic dimensions wants tensors only, one
``torch.export.Dim`` per symbol: :func:`export_program` builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .ir import GraphIR


def tensor_inputs(ir: GraphIR) -> list[int]:
    """Positions of the graph's tensor inputs: the ONNX model's inputs. A symbolic graph's integer
    inputs (the symbols' values) are not: the model reads each from a tensor's size."""
    return [i for i, n in enumerate(ir.placeholders) if isinstance(n.meta.get("val"), torch.Tensor)]


def export_program(
    ir: GraphIR, args: Sequence[Any], wrap: Callable[[torch.fx.GraphModule], torch.nn.Module] | None = None
) -> Any:
    """``torch.export`` of the graph; a symbolic graph keeps its symbols as dynamic dimensions
    (``torch.export.Dim``, one per symbol, with the range Dynamo knows) and its integer inputs are read
    from the tensors' sizes instead, so the program takes the graph's tensor inputs only
    (:func:`tensor_inputs`) and serves every size. ``wrap`` turns the graph module into the module
    exported (default: the graph module itself)."""
    if ir.is_static:
        return torch.export.export(wrap(ir.gm) if wrap else ir.gm, tuple(args), strict=False)
    import inspect

    from torch.export import Dim

    gm, symbols = _sizes_from_tensors(ir)
    dims: dict[str, Any] = {}
    shapes: list[Any] = []
    for i in tensor_inputs(ir):
        val = ir.placeholders[i].meta["val"]
        spec: dict[int, Any] = {}
        for d, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                name = str(size.node.expr)
                if name not in dims:
                    lo, hi = symbols.get(name, (2, None))
                    dims[name] = Dim(name, min=max(lo, 0), max=hi) if hi is not None else Dim(name, min=max(lo, 0))
                spec[d] = dims[name]
            elif isinstance(size, torch.SymInt):
                raise NotImplementedError(f"input {i} of {ir.name} has size {size} (an expression, not one symbol)")
        shapes.append(spec or None)
    tensors = tuple(args[i] for i in tensor_inputs(ir))
    module = wrap(gm) if wrap else gm
    params = inspect.signature(module.forward).parameters.values()
    packed = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    return torch.export.export(
        module, tensors, dynamic_shapes=(tuple(shapes),) if packed else tuple(shapes), strict=False
    )


def _sizes_from_tensors(ir: GraphIR) -> tuple[torch.fx.GraphModule, dict[str, tuple[int, int | None]]]:
    """A copy of the graph whose integer inputs are gone: each symbol is read from the size of a tensor
    input that has it (``aten.sym_size.int``). Also each symbol's range, as Dynamo's ShapeEnv knows it."""
    import copy

    gm = copy.deepcopy(ir.gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    where: dict[str, tuple[torch.fx.Node, int]] = {}
    ranges: dict[str, tuple[int, int | None]] = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False):
                    where.setdefault(str(size.node.expr), (node, d))
                    ranges[str(size.node.expr)] = _range_of(size)
    first_op = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node in placeholders:  # a partition's region may interleave placeholders with ops: inputs first
        first_op.prepend(node)
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            continue
        name = str(val.node.expr) if isinstance(val, torch.SymInt) else None
        if name not in where:
            raise NotImplementedError(f"{ir.name}: integer input {node.name} ({val}) is no tensor input's size")
        assert name is not None
        source, dim = where[name]
        with gm.graph.inserting_before(first_op):
            size_node = gm.graph.call_function(torch.ops.aten.sym_size.int, (source, dim))
        size_node.meta["val"] = val
        node.replace_all_uses_with(size_node)
        gm.graph.erase_node(node)
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    if isinstance(out.args[0], (tuple, list)):  # a size returned (saved for backward) is the caller's to compute
        out.args = (type(out.args[0])(o for o in out.args[0] if not _is_size(o)),)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm, ranges


def _is_size(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.SymInt)


def size_outputs(ir: GraphIR) -> dict[int, str]:
    """The graph's outputs that are sizes, not tensors (a forward graph saves ``s0`` for its backward):
    position -> the size's expression. :func:`export_program` leaves them out of the program."""
    return {i: str(o.meta["val"].node.expr) for i, o in enumerate(ir.outputs) if _is_size(o)}


def _range_of(size: torch.SymInt) -> tuple[int, int | None]:
    r = size.node.shape_env.var_to_range.get(size.node.expr)
    if r is None:
        return 2, None
    try:
        upper: int | None = int(r.upper)
    except (TypeError, ValueError, AttributeError, OverflowError):  # unbounded (int_oo)
        upper = None
    return int(r.lower), upper if upper is not None and upper < 2**62 else None
