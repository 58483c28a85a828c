"""Place a graph on one backend: the ops it claims run on it, the rest run eagerly between them.

``build_placement`` asks the backend's ``supports(node)`` for every op, groups the claimed ops into
maximal connected regions with torch.fx's capability-based partitioner, turns each region into its own
normalized :class:`GraphIR` and compiles it on the backend. The parent graph keeps the unclaimed ops
and calls the compiled regions in between. The backend's declarations shape this: a graph of a phase
it does not list in ``phases`` is refused; ``granularity="graph"`` refuses a graph with an unclaimed
op, ``"ops"`` compiles each claimed op as its own one-op region; a region with fewer than
``min_region_ops`` ops that move data runs eagerly.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from ..core.artifacts import MissingClaims
from ..core.backend import PHASES, Backend, CompileRequest, kernel_count_of, node_float_dtypes
from ..core.ir import GraphIR, op_name

# Ops that move no data: a region made only of these is not worth a backend call.
_TRIVIAL = {
    "view",
    "_unsafe_view",
    "reshape",
    "expand",
    "permute",
    "t",
    "squeeze",
    "unsqueeze",
    "getitem",
    "slice",
    "select",
    "alias",
    "detach",
    "transpose",
    "clone",
}


@dataclass
class Placement:
    """A graph compiled for one backend: the callable, and how many ops landed where."""

    backend: str
    fn: Callable[..., Sequence[Any]]
    ops_on_backend: int
    ops_eager: int
    regions: int
    compile_seconds: float
    kernels: int | None = None  # for code generators: how many kernels the graph became
    notes: list[str] = field(default_factory=list)
    plan: dict[str, list] | None = None  # a split placement (split.py): its cuts and each piece's backend
    eager_ops: list[str] = field(default_factory=list)  # Core ATen names of the ops left to eager, one per op

    @property
    def eager_summary(self) -> str:
        """ "3 ops eager (aten.sort.default x2, aten.nonzero.default)", or "" when none are."""
        if not self.ops_eager:
            return ""
        counts = Counter(self.eager_ops)
        names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items()))
        return f"{self.ops_eager} ops eager" + (f" ({names})" if names else "")


class _Claims(OperatorSupportBase):
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        try:
            return bool(self.backend.supports(node))
        except Exception:  # a capability check that raises is a "no"
            return False


def unsupported_ops(ir: GraphIR, backend: Backend) -> list[fx.Node]:
    claims = _Claims(backend)
    return [n for n in ir.op_nodes if not claims.is_node_supported(None, n)]


class _Region(torch.nn.Module):
    """Stands in for a fused submodule: calls the compiled region, returns what the submodule returned."""

    def __init__(self, fn: Callable[..., Sequence[Any]], single: bool) -> None:
        super().__init__()
        self.fn, self.single = fn, single

    def forward(self, *args: Any) -> Any:
        out = self.fn(*args)
        return out[0] if self.single else tuple(out)


def _region_inputs(parent: fx.GraphModule, args: Sequence[Any]) -> dict[str, list[Any]]:
    """Run the parent once eagerly and record the real arguments each fused region receives."""
    seen: dict[str, list[Any]] = {}

    class Rec(fx.Interpreter):
        def call_module(self, target: Any, a: Any, kw: Any) -> Any:
            seen[str(target)] = list(a)
            return super().call_module(target, a, kw)

    Rec(parent).run(*args)
    return seen


def build_placement(
    ir: GraphIR,
    backend: Backend,
    args: Sequence[Any],
    *,
    mode: str | None,
    options: dict[str, Any],
    program: Any = None,
) -> Placement:
    """Compile ``ir`` for ``backend``; raises whatever the backend raises (the tuner records it).
    ``program`` (an exported program ``ir`` came from) reaches the backend only with the whole graph."""
    t0 = time.perf_counter()
    n_ops = len(ir.op_nodes)
    phases = getattr(backend, "phases", PHASES)
    if ir.phase not in phases:
        raise NotImplementedError(f"compiles {' and '.join(sorted(phases))} graphs only, not {ir.phase} graphs")
    granularity = getattr(backend, "granularity", "regions")
    # a backend that exports whole programs itself (ONNX Runtime, AOTInductor) takes the program whole:
    # its claims describe its translation of single ATen ops, which it does not use then
    whole = program is not None and getattr(backend, "exports_programs", False)
    rejected = [] if whole else unsupported_ops(ir, backend)
    if not rejected and granularity != "ops":
        fn = backend.compile(CompileRequest(ir, list(args), mode, options, program=program))
        return Placement(backend.name, fn, n_ops, 0, 1, time.perf_counter() - t0, kernels=kernel_count_of(fn))
    if granularity == "graph":
        names = sorted({op_name(n) for n in rejected})
        raise NotImplementedError(f"compiles whole graphs only, and does not claim {', '.join(names)}")

    gm = copy.deepcopy(ir.gm)
    partitioner = CapabilityBasedPartitioner(gm, _Claims(backend), allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    if granularity == "ops":  # one region per claimed op
        proposed = [Partition(id=i, nodes=[n]) for i, n in enumerate(n for p in proposed for n in p.nodes)]
    least = max(1, int(getattr(backend, "min_region_ops", 1)))
    partitions = [p for p in proposed if sum(_base_name(n) not in _TRIVIAL for n in p.nodes) >= least]
    if not partitions:
        why = f"no region of {least}+ ops that move data" if least > 1 or not rejected else "none of the graph's ops"
        first = f" (first unclaimed: {op_name(rejected[0])}{_decline_reason(backend, rejected[0])})" if rejected else ""
        raise NotImplementedError(f"claims {why} among its {n_ops} ops{first}")
    placed = {n.name for p in partitions for n in p.nodes}
    eager_ops = [op_name(n) for n in gm.graph.nodes if n.op == "call_function" and n.name not in placed]
    fused = partitioner.fuse_partitions(partitions)
    calls = [n for n in fused.graph.nodes if n.op == "call_module"]
    kinds_of = {n.name: k for n, k in zip(ir.placeholders, ir.input_kinds)}
    region_kinds = {str(call.target): _normalize_region(fused, call, kinds_of) for call in calls}
    fused.recompile()
    inputs = _region_inputs(fused, args)
    on_backend, kernels = 0, 0
    for i, call in enumerate(calls):
        sub: fx.GraphModule = getattr(fused, str(call.target))
        out_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
        single = not isinstance(out_node.args[0], (tuple, list))
        if single:
            out_node.args = ((out_node.args[0],),)
            sub.recompile()
        sub_ir = GraphIR(sub, region_kinds[str(call.target)], name=f"{ir.name}.{backend.name}{i}", phase=ir.phase)
        fn = backend.compile(CompileRequest(sub_ir, inputs[str(call.target)], mode, options))
        kernels += kernel_count_of(fn) or 0
        on_backend += len(sub_ir.op_nodes)
        setattr(fused, str(call.target), _Region(fn, single))
    forward = fused.forward

    def run(*a: Any) -> list[Any]:
        return list(forward(*a))

    names = sorted({_base_name(n) for n in rejected})
    return Placement(
        backend.name,
        run,
        on_backend,
        n_ops - on_backend,
        len(calls),
        time.perf_counter() - t0,
        kernels=kernels or None,
        notes=[f"ran eagerly (not claimed): {', '.join(names[:8])}{'...' if len(names) > 8 else ''}"],
        eager_ops=eager_ops,
    )


def _normalize_region(parent: fx.GraphModule, call: fx.Node, kinds_of: dict[str, str]) -> list[str]:
    """Make the region that ``call`` runs a normalized graph like any other (core/ir.py, "What a backend
    receives"), and return its input kinds.

    The partitioner leaves every value a region reads from outside as a placeholder, created where it
    is first used (between the op nodes) and with no kind. Here: a tensor the parent holds as a
    ``get_attr`` (a frozen weight ``_frozen_N``, a small constant) becomes a ``get_attr`` of the region
    too, and leaves the call's arguments; the remaining placeholders move before every other node, in
    the call's argument order, each labelled with its kind in the parent (``"param"``/``"buffer"`` for
    a weight the parent holds as a placeholder, else ``"input"``); the ``get_attr`` nodes follow them."""
    sub: fx.GraphModule = getattr(parent, str(call.target))
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    consts: list[tuple[fx.Node, str, Any]] = []
    keep_args: list[Any] = []
    kinds: list[str] = []
    for ph, arg in zip([n for n in sub.graph.nodes if n.op == "placeholder"], call.args):
        meta = {**ph.meta, **({"val": arg.meta["val"]} if isinstance(arg, fx.Node) and "val" in arg.meta else {})}
        value = _attr(parent, str(arg.target)) if isinstance(arg, fx.Node) and arg.op == "get_attr" else None
        if isinstance(value, torch.Tensor):
            consts.append((ph, str(arg.target).replace(".", "_"), value))  # type: ignore[union-attr]
            ph.meta = meta
            continue
        env[ph] = graph.placeholder(ph.name)
        env[ph].meta = meta
        keep_args.append(arg)
        parent_ph = arg if isinstance(arg, fx.Node) and arg.op == "placeholder" else None
        kinds.append(kinds_of.get(parent_ph.name, "input") if parent_ph is not None else "input")
    for ph, name, value in consts:
        sub.register_buffer(name, value)
        env[ph] = graph.get_attr(name)
        env[ph].meta = ph.meta
    for node in sub.graph.nodes:
        if node.op != "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.lint()
    sub.graph = graph  # recompiles
    call.args = tuple(keep_args)
    return kinds


def _decline_reason(backend: Backend, node: fx.Node) -> str:
    """Why ``node`` was not claimed, when the reason is not the op itself: no claims file yet, or the
    dtype (outside the backend's ``dtypes``, or the op claimed in another dtype only); else ""."""
    claims = getattr(backend, "claims", None)
    if isinstance(claims, MissingClaims):
        return f": its claims file {claims.path} does not exist yet (python -m torchmux.testing.probe writes it)"
    floats = sorted(str(d).removeprefix("torch.") for d in node_float_dtypes(node))
    listed = [str(d).removeprefix("torch.") for d in getattr(backend, "dtypes", ())]
    outside = [d for d in floats if d not in listed]
    if outside:
        return f": it computes in {', '.join(outside)}, and the backend's dtypes are {', '.join(listed) or 'none'}"
    if claims is not None:
        name = op_name(node)
        missing = [d for d in floats if name not in claims.get(d, ())]
        elsewhere = sorted(d for d, ops in claims.items() if name in ops)
        if missing and elsewhere:
            return f": claimed in {', '.join(elsewhere)}, not in {', '.join(missing)}"
    return ""


def _attr(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _base_name(node: fx.Node) -> str:
    t = node.target
    name = getattr(t, "__name__", str(t))
    if isinstance(t, torch._ops.OpOverload):
        name = t._schema.name.split("::")[-1]
    return name
