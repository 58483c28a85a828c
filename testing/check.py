"""Run one op case on one backend and compare with the reference interpreter.

The backend conformance suite (tests/conformance/) calls :func:`check`; so does
``python -m torchmux.testing.probe BACKEND``, which writes the ops a backend passes: that file, and
nothing else, is what a backend may claim (``Backend.claims``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..autotune.placement import build_placement, unsupported_ops
from ..core.backend import Backend
from ..core.compare import mismatch
from ..core.ir import GraphIR, op_name
from ..core.trace import trace


def case_ir(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], name: str) -> GraphIR:
    return trace(fn, inputs, name=name)


def claims(backend: Backend, ir: GraphIR, op: str) -> bool:
    """Whether the backend claims every node of ``op`` in ``ir``."""
    rejected = set(unsupported_ops(ir, backend))
    nodes = [n for n in ir.op_nodes if op_name(n) == op]
    return bool(nodes) and not any(n in rejected for n in nodes)


def check(backend: Backend, ir: GraphIR, inputs: Sequence[torch.Tensor], tol: float = 1.0) -> str | None:
    """Compile ``ir`` on ``backend`` (unclaimed helper ops run eagerly), run it, compare: None if right."""
    reference = ir.run_reference(*inputs)
    placement = build_placement(ir, backend, inputs, mode=None, options={})
    out = placement.fn(*inputs)
    return mismatch(out, reference, scale=tol)
