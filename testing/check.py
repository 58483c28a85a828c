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
from ..autotune.verify import check_call
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


def check(
    backend: Backend, ir: GraphIR, inputs: Sequence[torch.Tensor], tol: float = 1.0, *, values_only: bool = False
) -> str | None:
    """Compile ``ir`` on ``backend`` (unclaimed helper ops run eagerly), run it, compare: None if right.

    Right means what the runtime accepts at a user's first call: the values (within the case's
    tolerance) and then the runtime's own ``check_call`` on two more calls (no input written, no
    input's buffer returned, no output overwritten by a later call). What the probe writes as claims
    passed all of it; :mod:`torchmux.testing.kit` reports each check on its own. ``values_only``: the
    values alone (the NaN/±inf variants: their question is the values)."""
    reference = ir.run_reference(*[a.clone() for a in inputs])
    placement = build_placement(ir, backend, inputs, mode=None, options={})
    out = list(placement.fn(*[a.clone() for a in inputs]))
    wrong = mismatch(out, reference, scale=tol)
    if wrong or values_only:
        return wrong
    # a case with a wider tolerance is compared with the backend's own first answer, checked above
    return check_call(ir, placement.fn, inputs, twice=True, reference=None if tol == 1 else out)[1]


def grown(inputs: Sequence[torch.Tensor], by: int = 3) -> list[torch.Tensor]:
    """The inputs at a second size: every dimension equal to the first input's first dimension grows
    by ``by`` (in every input alike, so shapes that agreed still agree); values are drawn afresh the
    same way (integer inputs keep their range)."""
    size = inputs[0].shape[0] if inputs and inputs[0].dim() else None
    gen = torch.Generator().manual_seed(1)
    out = []
    for t in inputs:
        shape = [d + by if d == size else d for d in t.shape]
        if t.dtype.is_floating_point:
            new = torch.randn(shape, generator=gen).to(t.dtype)
            new = new.abs() + 0.5 if bool((t > 0).all()) else new
        elif t.dtype == torch.bool:
            new = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            new = torch.randint(int(t.min()), int(t.max()) + 1, shape, generator=gen).to(t.dtype)
        out.append(new.to(t.device))
    return out


def symbolic_calls(
    fn: Callable[..., Any], sizes: Sequence[Sequence[torch.Tensor]], name: str
) -> tuple[GraphIR, list[list[Any]]]:
    """Capture ``fn`` once with symbolic shapes (Dynamo, ``dynamic=True``) and call it at each of
    ``sizes``: the symbolic graph and the graph's own arguments at each size."""
    from ..frontends.dynamo import TorchmuxDynamoBackend

    graphs: list[GraphIR] = []
    calls: list[list[Any]] = []

    def place(ir: GraphIR) -> Callable[..., Any]:
        graphs.append(ir)

        def run(*args: Any) -> list[Any]:
            calls.append(list(args))
            return ir.run_reference(*args)

        return run

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=TorchmuxDynamoBackend(place), dynamic=True, fullgraph=True)
    with torch.no_grad():
        for inputs in sizes:
            compiled(*inputs)
    if len(graphs) != 1 or graphs[0].is_static or len(calls) != len(sizes):
        raise ValueError(f"{name}: not one symbolic graph for {len(sizes)} sizes ({len(graphs)} graphs)")
    graphs[0].name = name
    return graphs[0], calls


def check_sizes(backend: Backend, ir: GraphIR, calls: Sequence[Sequence[Any]], tol: float = 1.0) -> str | None:
    """Compile the symbolic ``ir`` on ``backend`` once (at the first call's sizes) and run every call
    through that one compiled graph: None if each answer is right."""
    placement = build_placement(ir, backend, calls[0], mode=None, options={})
    for args in calls:
        wrong = mismatch(placement.fn(*args), ir.run_reference(*args), scale=tol)
        if wrong:
            return f"at sizes {[tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]}: {wrong}"
    return None


def check_nonfinite(backend: Backend, case: Any, dtype: torch.dtype, device: str = "cpu") -> str | None:
    """:func:`check` on the case's NaN/±inf variant, on ``device``: None if the backend matches eager on them too."""
    inputs = [t.to(device) for t in case.nonfinite_inputs(dtype)]
    traced = [t.to(device) for t in case.inputs(dtype)]
    return check(backend, case_ir(case.fn, traced, case.id), inputs, case.tol, values_only=True)
