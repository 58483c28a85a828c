"""Split a graph into segments and run each segment on the backend that measures fastest on it.

Whole-graph placement (tuner.py) asks which backend runs the *graph* fastest. Backends are not
uniformly good: on one model ONNX Runtime may win the attention blocks and Inductor the MLPs. Collage
(TVM) showed that placing pieces of a graph by measurement beats the best single backend. This is that
step, kept cheap enough to run at compile time:

1. **Cut.** ``cut_points`` walks the ops in graph order and cuts where the fewest intermediate values
   are live (a layer boundary in a transformer: the hidden state and the mask), near evenly spaced
   targets, so that every segment holds at least ``min_ops`` ops. Cutting in topological order keeps
   the segments a chain: segment *i* reads only graph inputs and earlier segments' outputs.
2. **Measure each segment.** Every segment becomes a normalized :class:`GraphIR` of its own, with the
   real values it receives on this call, and goes through the tuner like any graph: compiled on every
   candidate, checked against the reference interpreter, timed, the fastest correct one kept.
3. **Stitch and check.** The segments' winners are stitched back into one callable. That callable is
   one more candidate for the whole graph: it is checked against the whole graph's reference answer
   and timed against the best single backend, in the same rounds. It wins only if it is faster; the
   boundaries between backends cost a call each and a lost fusion, and the measurement decides.

Every trial (the cut's own run of the graph, each piece's checks and timing, the stitched
callable's check and timing) runs on copies of the user's inputs, and each piece's compile and first
calls under the trial deadline, as in tuner.py.

Only backends that came within the tuner's screening factor of the best on the whole graph compete
for segments: a backend 20x slower on the whole graph does not win a quarter of it, and compiling it
again per segment would only add compile time.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from ..core import settings
from ..core.backend import Backend
from ..core.compare import mismatch
from ..core.ir import GraphIR
from .placement import Placement, _Region, _region_inputs
from .tuner import SCREEN_FACTOR, Measurement, choose, measure, short_error, time_rounds
from .verify import clone_inputs


@dataclass
class Piece:
    """A segment as cut: the parent's attribute that calls it, its normalized graph, whether the parent
    expects a single value from it (not a tuple), and the real values it receives."""

    attr: str
    ir: GraphIR
    single: bool
    args: list[Any]


@dataclass
class Segment:
    """One segment of a split graph and how each candidate did on it."""

    ir: GraphIR
    measurements: list[Measurement]

    @property
    def chosen(self) -> Measurement | None:
        return choose(self.measurements)


def _live_after(ops: list[fx.Node]) -> list[int]:
    """``live[i]``: how many values computed by ``ops[:i + 1]`` are still read by ``ops[i + 1:]`` or
    returned by the graph."""
    pos = {n: i for i, n in enumerate(ops)}
    last = {}
    for i, n in enumerate(ops):
        uses = [pos.get(u, len(ops)) for u in n.users]  # the output node reads at the end
        last[i] = max(uses, default=i)
    live, open_ = [], 0
    ends = [0] * (len(ops) + 1)
    for i in range(len(ops)):
        if last[i] > i:
            open_ += 1
            ends[min(last[i], len(ops))] += 1
        open_ -= ends[i]
        ends[i] = 0
        live.append(open_)
    return live


def cut_points(ir: GraphIR, segments: int, min_ops: int = 8) -> list[int]:
    """Positions ``c`` (cut after ``ir.op_nodes[c]``) that split the graph into at most ``segments``
    pieces of at least ``min_ops`` ops, each cut where the fewest values cross it (ties: nearest to an
    even split). Returns ``[]`` when the graph is too small to split."""
    ops = ir.op_nodes
    n = len(ops)
    segments = min(segments, n // max(min_ops, 1))
    if segments < 2:
        return []
    live = _live_after(ops)
    pos = {node: i for i, node in enumerate(ops)}
    for j, node in enumerate(ops):  # never between a multi-output op and the getitems that unpack it
        if isinstance(node.meta.get("val"), (tuple, list)):
            for i in range(j, max((pos.get(u, n) for u in node.users), default=j)):
                live[i] = n + 1  # worse than any real cut
    cuts: list[int] = []
    window = n / (2 * segments)
    for j in range(1, segments):
        target = j * n / segments
        lo = max(int(target - window), (cuts[-1] + min_ops) if cuts else min_ops - 1)
        hi = min(int(target + window), n - 1 - min_ops)
        if lo > hi:
            continue
        best = min(range(lo, hi + 1), key=lambda i: (live[i], abs(i - target)))
        if live[best] <= n:
            cuts.append(best)
    return cuts


def split(ir: GraphIR, cuts: Sequence[int], args: Sequence[Any]) -> tuple[fx.GraphModule, list[Piece]]:
    """Split ``ir`` after each op position in ``cuts``. Returns the parent module (it calls
    ``submod_<i>`` in order) and one :class:`Piece` per segment, with the values it receives when the
    graph runs on ``args``."""
    ops = ir.op_nodes
    segment_of: dict[fx.Node, int] = {}
    seg = 0
    for i, node in enumerate(ops):
        segment_of[node] = seg
        if seg < len(cuts) and i == cuts[seg]:
            seg += 1
    gm = copy.deepcopy(ir.gm)
    by_name = {n.name: segment_of[n] for n in ops}
    parent = split_module(gm, gm, lambda node: by_name.get(node.name, 0), keep_original_order=True)
    _own_constants(parent)
    kinds = dict(zip((p.name for p in ir.placeholders), ir.input_kinds))
    inputs = _region_inputs(parent, args)
    out: list[Piece] = []
    for call in [n for n in parent.graph.nodes if n.op == "call_module"]:
        sub: fx.GraphModule = getattr(parent, str(call.target))
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        sub_kinds = []
        for ph, arg in zip(placeholders, call.args):
            if isinstance(arg, fx.Node) and "val" in arg.meta:
                ph.meta["val"] = arg.meta["val"]
            sub_kinds.append(kinds.get(arg.name, "input") if isinstance(arg, fx.Node) else "input")
        out_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
        single = not isinstance(out_node.args[0], (tuple, list))
        if single:  # a graph returns a tuple; the parent keeps its own copy that returns the value
            sub = copy.deepcopy(sub)
            out_node = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
            out_node.args = ((out_node.args[0],),)
            sub.recompile()
        index = len(out)
        seg_ir = GraphIR(sub, sub_kinds, name=f"{ir.name}.seg{index}", phase=ir.phase)
        out.append(Piece(str(call.target), seg_ir, single, inputs[str(call.target)]))
    return parent, out


def _own_constants(parent: fx.GraphModule) -> None:
    """``split_module`` leaves a frozen graph's constants (its weights, ``get_attr``) in the parent and
    passes them to the pieces as inputs; each piece that reads one holds it instead, as the whole
    graph did: a backend sees a weight as a constant (ONNX Runtime folds and prepacks it) and a piece
    exported on its own (a package's split) carries its weights."""
    for call in [n for n in parent.graph.nodes if n.op == "call_module"]:
        sub: fx.GraphModule = getattr(parent, str(call.target))
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        kept = []
        for ph, arg in zip(placeholders, call.args):
            if not (isinstance(arg, fx.Node) and arg.op == "get_attr"):
                kept.append(arg)
                continue
            value: Any = parent
            for part in str(arg.target).split("."):
                value = getattr(value, part)
            name = "_const_" + str(arg.target).replace(".", "_")
            if isinstance(value, torch.Tensor):
                sub.register_buffer(name, value)
            else:
                setattr(sub, name, value)
            with sub.graph.inserting_before(ph):
                node = sub.graph.get_attr(name)
            node.meta = dict(ph.meta)
            ph.replace_all_uses_with(node)
            sub.graph.erase_node(ph)
        if len(kept) != len(call.args):
            call.args = tuple(kept)
            sub.recompile()
    parent.graph.eliminate_dead_code()
    parent.recompile()


def contenders(results: Sequence[Measurement], factor: float) -> list[str]:
    """The backends that may compete for segments: correct on the whole graph and within ``factor``
    of the best one's time."""
    ok = [m for m in results if m.ok and m.seconds == m.seconds]
    if not ok:
        return []
    best = min(m.seconds for m in ok)
    return [m.backend for m in ok if m.seconds <= factor * best]


@dataclass(frozen=True)
class Plan:
    """Where a graph is cut (after these op positions) and which backend runs each piece."""

    cuts: tuple[int, ...]
    backends: tuple[str, ...]

    def merged(self) -> Plan:
        """Neighbours that chose the same backend become one piece: one call fewer, and the backend
        may fuse across what was a cut."""
        keep = [c for c, a, b in zip(self.cuts, self.backends, self.backends[1:]) if a != b]
        names = [self.backends[0]] + [b for a, b in zip(self.backends, self.backends[1:]) if a != b]
        return Plan(tuple(keep), tuple(names))

    def as_record(self) -> dict[str, list]:
        return {"cuts": list(self.cuts), "backends": list(self.backends)}

    @classmethod
    def from_record(cls, record: Any) -> Plan | None:
        try:
            plan = cls(tuple(int(c) for c in record["cuts"]), tuple(str(b) for b in record["backends"]))
        except (KeyError, TypeError, ValueError):
            return None
        return plan if len(plan.backends) == len(plan.cuts) + 1 else None


def place_segments(
    ir: GraphIR,
    backends: Sequence[Backend],
    args: Sequence[Any],
    *,
    segments: int,
    mode: str | None,
    options: Callable[[str], dict[str, Any]],
    time_budget: float,
    deadline: float | None = None,
) -> tuple[Plan, list[Segment]] | None:
    """Cut ``ir`` into up to ``segments`` pieces and measure every backend on each (compiled, checked
    against the piece's reference, timed). Returns the plan of each piece's winner, merged, or ``None``
    when the graph is too small to cut, a piece has no correct backend, or one backend won them all."""
    cuts = cut_points(ir, segments)
    if not cuts:
        return None
    _, pieces = split(ir, cuts, clone_inputs(args, ir.input_kinds))  # trials never touch the user's tensors
    done = [
        Segment(
            p.ir,
            measure(
                p.ir,
                backends,
                p.args,
                mode=mode,
                options=options,
                time_budget=time_budget / len(pieces),
                deadline=deadline,
            ),
        )
        for p in pieces
    ]
    if settings.VERBOSE.get():
        for seg in done:
            print(
                f"[torchmux]   {seg.ir.name} ({len(seg.ir.op_nodes)} ops): "
                + " | ".join(m.summary for m in seg.measurements),
                file=sys.stderr,
            )
    winners = [seg.chosen for seg in done]
    if any(w is None for w in winners):
        return None
    plan = Plan(tuple(cuts), tuple(w.backend for w in winners))  # type: ignore[union-attr]
    return (plan.merged(), done) if len(set(plan.backends)) > 1 else None


def build_split(
    ir: GraphIR,
    plan: Plan,
    backends: Sequence[Backend],
    args: Sequence[Any],
    *,
    mode: str | None,
    options: Callable[[str], dict[str, Any]],
    deadline: float | None = None,
) -> Placement | None:
    """Compile ``ir`` cut as ``plan`` says, each piece on its backend (each piece checked against its
    own reference on the way). ``None`` when a piece's backend is not among ``backends`` or fails."""
    t0 = time.perf_counter()
    by_name = {b.name: b for b in backends}
    if any(name not in by_name for name in plan.backends) or any(c >= len(ir.op_nodes) - 1 for c in plan.cuts):
        return None
    parent, pieces = split(ir, plan.cuts, clone_inputs(args, ir.input_kinds))  # never on the user's tensors
    placements: list[Placement] = []
    for piece, name in zip(pieces, plan.backends):
        result = measure(
            piece.ir, [by_name[name]], piece.args, mode=mode, options=options, timed=False, deadline=deadline
        )[0]
        if not result.ok or result.placement is None:
            return None
        placements.append(result.placement)
        setattr(parent, piece.attr, _Region(result.placement.fn, piece.single))
    forward = parent.forward

    def run(*a: Any) -> list[Any]:
        return list(forward(*a))

    return Placement(
        label(plan.backends),
        run,
        ops_on_backend=sum(p.ops_on_backend for p in placements),
        ops_eager=sum(p.ops_eager for p in placements),
        regions=sum(p.regions for p in placements),
        compile_seconds=time.perf_counter() - t0,
        notes=[
            "pieces: "
            + ", ".join(f"{len(piece.ir.op_nodes)} ops on {name}" for piece, name in zip(pieces, plan.backends))
        ],
        plan=plan.as_record(),
    )


def label(names: Sequence[str]) -> str:
    """``split(onnxruntime,inductor)``: the backend of each piece, in order."""
    return f"split({','.join(names)})"


def try_split(
    ir: GraphIR,
    results: Sequence[Measurement],
    backends: Sequence[Backend],
    args: Sequence[Any],
    *,
    segments: int,
    mode: str | None,
    options: Callable[[str], dict[str, Any]],
    time_budget: float,
    deadline: float | None = None,
) -> Measurement | None:
    """The split candidate for ``ir``, checked against the whole graph's reference and timed head to head
    with the best whole-graph candidate in ``results`` (whose figure is left as it was), or
    ``None`` when there is nothing to split (too small, fewer than two contenders, one backend won every
    segment). A split that fails or answers wrong comes back as a failed measurement."""
    names = contenders(results, SCREEN_FACTOR)
    pool = [b for b in backends if b.name in names]
    best = choose(results)
    if len(pool) < 2 or best is None or best.placement is None:
        return None
    t0 = time.perf_counter()
    args = clone_inputs(args, ir.input_kinds)  # the split's trials and timing never touch the user's tensors
    try:
        placed = place_segments(
            ir,
            pool,
            args,
            segments=segments,
            mode=mode,
            options=options,
            time_budget=time_budget / 2,
            deadline=deadline,
        )
        placement = placed and build_split(ir, placed[0], pool, args, mode=mode, options=options, deadline=deadline)
    except Exception as e:  # splitting itself failed (an fx pass on an unusual graph): not a candidate
        return Measurement("split", math.inf, False, f"split failed: {short_error(e)}", time.perf_counter() - t0)
    if not placement:
        return None
    placement.compile_seconds = time.perf_counter() - t0
    m = Measurement(placement.backend, math.inf, False, "", placement.compile_seconds, placement)
    try:
        wrong = mismatch(placement.fn(*clone_inputs(args, ir.input_kinds)), ir.run_reference(*args))
    except Exception as e:
        m.reason = f"crashed: {short_error(e)}"
        return m
    if wrong:
        m.reason = f"wrong answer: {wrong}"
        return m
    # head to head with the best whole-graph candidate, in rounds of their own; the split's figure is
    # put on the scale of the earlier rounds (best's time times the ratio), so that it compares with
    # every other candidate's figure as they were measured together
    rival = Measurement(best.backend, best.seconds, True)
    m.ok, m.seconds = True, best.seconds
    time_rounds([(rival, best.placement.fn), (m, placement.fn)], args, time_budget / 2, max_rounds=25)
    if m.ok:
        m.samples = [s * best.seconds / rival.seconds for s in m.samples]
        m.seconds = m.seconds * best.seconds / rival.seconds
    return m
