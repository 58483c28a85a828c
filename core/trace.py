"""Trace a plain function into a normalized :class:`GraphIR` without Dynamo.

The conformance suite, benchmarks and tests use it to build graphs directly. It normalizes the same
way the frontend does (AOTAutograd: functionalize, decompose to Core ATen), without Dynamo, so
it needs no nn.Module and touches no Dynamo cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from functorch.compile import aot_function
from torch._decomp import core_aten_decompositions

from .ir import GraphIR


def trace(fn: Callable[..., Any], args: Sequence[Any], *, name: str = "traced") -> GraphIR:
    """Normalize ``fn(*args)`` (tensor arguments, tensor or tuple-of-tensor result) into a linted GraphIR."""

    def flat(*a: Any) -> tuple[Any, ...]:
        out = fn(*a)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    captured: dict[str, Any] = {}

    def grab(gm: torch.fx.GraphModule, _inputs: Any) -> Callable[..., Any]:
        captured["gm"] = gm
        return gm

    with torch.no_grad():
        aot_function(flat, fw_compiler=grab, decompositions=core_aten_decompositions())(*args)
    gm = captured["gm"]
    # tracing may leave detach()/alias nodes and dead code; neither belongs in the IR
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return GraphIR(gm, name=name).lint()
