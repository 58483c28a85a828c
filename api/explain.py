"""``torchmux.explain``: how a program was captured and where each graph runs.

Graph and break counts are computed as ``torch._dynamo.explain`` computes them (one entry per graph
Dynamo compiled; break reasons de-duplicated by the user's innermost frame), so the two agree on the
same program. On top it says, per graph, how many ATen ops the normalized graph holds and which backend
the autotuner chose for it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.config import resolve
from ..core.userframe import in_torch
from ..frontends.dynamo import SUPPRESSED, CapturedGraph, Recorder, TorchmuxDynamoBackend, while_tracing
from ..frontends.mend.pipeline import MEND_DIR
from ..frontends.mend.runtime import DATA_DEPENDENT_IF
from .compile import runner_factory


@dataclass(frozen=True)
class BreakReason:
    reason: str
    filename: str
    lineno: int
    line: str = ""

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.lineno}"

    @property
    def advice(self) -> str:
        """What to change at the user's line so that this break goes (:func:`what_to_change`)."""
        return what_to_change(self.reason)

    def __str__(self) -> str:
        first = self.reason.strip().splitlines()[0] if self.reason.strip() else "?"
        text = f"{self.where}: {first}" + (f"  [{self.line.strip()}]" if self.line.strip() else "")
        return text + (f"\n       what to change: {self.advice}" if self.advice else "")


#: (a piece of Dynamo's reason, what to change at the user's line), first match wins: the kinds of break
#: left on real research code once the mend pass has run (ParityBench), each with its remedy
_ADVICE: tuple[tuple[str, str], ...] = (
    (
        "_LegacyVariableBase",
        "torch.autograd.Variable(t) of a value computed here: write t itself (t.detach() if it must not "
        "carry gradients); Variable has been a no-op wrapper since PyTorch 0.4 (the mend pass rewrites it "
        "only in a module's forward, its self.<method>s and the global functions they call)",
    ),
    (
        "data-dependent expression",
        "a Python int, bool or size read from a tensor's values decides this line: where the code already "
        "assumes a range or an outcome, say it with torch._check(...) before (e.g. torch._check(n > 0)); "
        "otherwise keep the value a tensor (torch.where instead of an if)",
    ),
    (
        "generic_jump SymNode",
        "an if on a size that depends on the data (the rows a boolean mask selects: len(y) == 0): where the "
        "code never takes that branch on real inputs, say it with torch._check(len(y) > 0) before the if; "
        "otherwise keep both outcomes tensors (torch.where) so no Python branch is needed",
    ),
    (
        "generic_jump TensorVariable",
        "an if (and/or) on a tensor's value that the mend pass could not rewrite: a check that raises before "
        "code that could fail or write on the same data, say (if x.min() < lo or x.max() > hi: raise ...). "
        "For such a check, torch._assert_async(~((x.min() < lo) | (x.max() > hi)), msg) keeps it in the graph "
        "(a RuntimeError with msg); otherwise compute both sides and pick with torch.where, or use torch.cond",
    ),
    (
        "Data dependent operator",
        "an operator whose output size depends on tensor values: NumPy on values Dynamo traces (np.arange of "
        "an np.array(x.shape) entry: the sizes become data), or nonzero/unique. Compute sizes with Python "
        "ints (x.shape[2] is an int), or build such constants (anchors, grids) outside the compiled function",
    ),
    (
        "data-dependent size",
        "an if on a size that depends on the data: where the code never takes that branch on real inputs, "
        "say it with torch._check(...) before the if; otherwise keep both outcomes tensors (torch.where)",
    ),
    (
        "Data-dependent branching",
        "an if/while on a tensor's value that the mend pass could not rewrite (a branch with effects other "
        "than assignments and logs): compute both sides and pick with torch.where, or use torch.cond",
    ),
    (
        "Observed exception",
        "Dynamo met an exception while tracing (an autograd.Function whose backward raises, a raise inside "
        "a try): keep the raising code out of the compiled function (a backward that raises can return "
        "None gradients instead), or run that part under torch.compiler.disable",
    ),
    (
        "requires_grad",
        "set requires_grad on inputs or parameters outside the compiled function (or create the tensor "
        "with requires_grad=... there)",
    ),
    (
        "Failed to mutate tensor data attribute",
        "x.data = f(x.data) on a tensor computed in this function: Dynamo cannot swap the storage under a "
        "value it traced. Bind a new tensor instead, x = f(x.detach()) (a straight-through estimator that "
        "keeps x's gradient: x = x + (f(x) - x).detach()), and pass that x on where other code should see it",
    ),
    (
        "set_ on a graph input",
        "w.data = ... on a parameter (or input) this graph also changes another way: the graph runs eagerly, "
        "correctly. To compile it, set the parameter's values before the call, outside the compiled "
        "function (with torch.no_grad(): w.copy_(f(w.org))), and keep .data = out of forward",
    ),
    (
        "torch._sym_",
        "a Python number computed from tensor values inside the graph (math.log2 of an .item(), kept on the "
        "module: calibration): the graph runs eagerly. Run such calibration calls before compiling, or keep "
        "the number a tensor (torch.log2, torch.ceil)",
    ),
    (
        "Tensor.item",
        "a .item() read in Python: keep the value a tensor, or torch._check the range the code assumes",
    ),
    (
        "marked as skipped",
        "Dynamo does not trace this call (a C extension, a builtin, or a file Dynamo skips): call it outside "
        "the compiled function, or, if it only computes on tensors, mark it with torch.compiler.allow_in_graph",
    ),
)


def what_to_change(reason: str) -> str:
    """The remedy for a break Dynamo gave ``reason`` for ("" where none is known)."""
    return next((advice for piece, advice in _ADVICE if piece in reason), "")


@dataclass
class GraphReport:
    index: int
    torch_ops: list[str]
    aten_ops: int
    placements: list[str]  # one "phase: backend (ms)" string per normalized graph and input signature
    kernels: int | None = None
    error: str | None = None
    measurements: list[str] = field(default_factory=list)  # every candidate the autotuner tried


@dataclass
class ExplainReport:
    graph_count: int
    graph_break_count: int
    break_reasons: list[BreakReason]
    graphs: list[GraphReport]
    rewrites: list[str] = field(default_factory=list)
    #: what was not captured at all: a frame Dynamo skipped, a recompile limit hit, a graph run eagerly
    not_captured: list[BreakReason] = field(default_factory=list)
    #: the mend pass's rewrites were not kept (``frontends/mend/verdict.py``): why, then each rewrite
    reverted: list[str] = field(default_factory=list)

    @property
    def ops_per_graph(self) -> list[list[str]]:
        return [g.torch_ops for g in self.graphs]

    @property
    def backends(self) -> list[list[str]]:
        return [g.placements for g in self.graphs]

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}"]
        if self.break_reasons:
            lines.append("Break Reasons:")
            lines += [f"  {i + 1}. {r}" for i, r in enumerate(self.break_reasons)]
        if self.not_captured:
            lines.append("Not captured (runs as plain Python or eagerly):")
            lines += [f"  - {r}" for r in self.not_captured]
        if self.rewrites:
            lines.append("Rewrites applied:")
            lines += [f"  - {r}" for r in self.rewrites]
        if self.reverted:
            lines.append(f"Rewrites not kept (captured as written: {self.reverted[0]}):")
            lines += [f"  - {r}" for r in self.reverted[1:]]
        if self.graphs:
            lines.append("")
            rows = [("graph", "torch ops", "aten ops", "kernels", "runs on")]
            for g in self.graphs:
                rows.append(
                    (
                        str(g.index),
                        str(len(g.torch_ops)),
                        str(g.aten_ops),
                        "-" if g.kernels is None else str(g.kernels),
                        g.error or "; ".join(g.placements) or "(not run)",
                    )
                )
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            for j, r in enumerate(rows):
                lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
                if j == 0:
                    lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 10)
        return "\n".join(lines)


def _op_name(target: Any) -> str:
    return getattr(target, "__name__", None) or str(target)


def break_reasons_of(graphs: list[CapturedGraph]) -> list[BreakReason]:
    deduped: dict[str, BreakReason] = {}
    for g in graphs:
        r = g.break_reason
        if r is None or not getattr(r, "graph_break", False) or not r.user_stack:
            continue
        # the user's innermost frame: torch's own files (its polyfills, nn.Module's call) and the mend
        # pass's runtime helpers (frontends/mend/) are not the user's code
        frames = [
            f for f in r.user_stack if not (f.filename.startswith(MEND_DIR) or in_torch(f.filename))
        ] or r.user_stack
        frame, reason = frames[-1], r.reason
        if frame is not r.user_stack[-1] and "ComptimeContext graph break" in reason:
            reason = DATA_DEPENDENT_IF  # the one break the mend runtime makes itself
        deduped[repr(frame)] = BreakReason(reason, frame.filename, frame.lineno or 0, frame.line or "")
    return list(deduped.values())


def graph_report(g: CapturedGraph) -> GraphReport:
    placements: list[str] = []
    measurements: list[str] = []
    aten_ops, kernels = 0, None
    for runner in g.runners:
        aten_ops = max(aten_ops, len(runner.ir.op_nodes))
        for d in runner.placements():
            p = d.chosen.placement
            ms = (
                ""
                if d.chosen.seconds != d.chosen.seconds or d.chosen.seconds == float("inf")
                else f" {d.chosen.seconds * 1e3:.3f} ms"
            )
            split = f", {p.eager_summary}" if p is not None and p.ops_eager else ""
            placements.append(f"{runner.ir.phase}: {d.backend}{ms}{split}")
            measurements.append(f"graph {g.index} {runner.ir.phase}: " + " | ".join(m.summary for m in d.measurements))
            if p is not None and p.kernels is not None:
                kernels = (kernels or 0) + p.kernels
    return GraphReport(
        g.index, [_op_name(t) for t in g.torch_ops], aten_ops, placements, kernels, g.error, measurements
    )


def last_measurements(report: ExplainReport) -> list[str]:
    """One line per graph: every candidate's latency or failure reason."""
    return [m for g in report.graphs for m in g.measurements]


def compile_recorded(model: Any, backend: Any = "auto", mend: bool = True) -> tuple[Any, Recorder]:
    """Compile like ``torchmux.compile`` and keep a Recorder of every graph it captures (for reports)."""
    config = resolve(backend, None, {"mend": mend})
    recorder = Recorder()
    recorder.unsupported_before = _unsupported_now()  # type: ignore[attr-defined]  # report() diffs it
    recorder.entry = model  # type: ignore[attr-defined]  # where a skipped frame is, when Dynamo does not say
    rewrites: Any = []
    if mend:
        from ..frontends.mend import mend as mend_source
        from ..frontends.mend import scoped

        model, rewrites = mend_source(model)
    compiled = torch.compile(model, backend=TorchmuxDynamoBackend(runner_factory(config), recorder), dynamic=False)
    if isinstance(compiled, torch.nn.Module):  # torchmux's Dynamo options while Dynamo traces, as compile() sets
        from ..frontends.mend import cond_refusals

        while_tracing(compiled, handled=cond_refusals if mend else None)
    recorder.suppressed_before = len(SUPPRESSED)  # type: ignore[attr-defined]  # report() lists the frames after
    recorder.rewrites = rewrites  # type: ignore[attr-defined]  # report() lists those that fired
    return (scoped(compiled) if mend else compiled), recorder


def report(recorder: Recorder, rewrites: list[str] | None = None) -> ExplainReport:
    reasons = break_reasons_of(recorder.graphs)
    if rewrites is None:
        rewrites = getattr(recorder, "rewrites", [])
    return ExplainReport(
        len(recorder.graphs),
        len(reasons),
        reasons,
        [graph_report(g) for g in recorder.graphs],
        list(rewrites),
        not_captured(recorder, reasons),
    )


def explain(model: Any, *args: Any, backend: Any = None, mend: bool = True, **kwargs: Any) -> ExplainReport:
    """Capture ``model(*args, **kwargs)`` once, run it, and report graphs, breaks and placements.

    Like ``torch._dynamo.explain`` this resets Dynamo's caches before and after. By default it only
    captures (the graphs run eagerly: about the time ``torch._dynamo.explain`` takes) and reports no
    placement; ``backend=`` (compile()'s argument: ``"auto"``, a name, a list) also places each graph
    and reports where it runs and what was measured. ``mend=False`` turns the graph-break mending pass
    off (model keyword arguments named ``backend`` or ``mend`` cannot be passed through here). Where the
    mend pass's capture may be worse than Dynamo's on the code as written, that one is captured too, on
    copies, and the better kept (:func:`capture`).
    """
    _, result = capture(model, args, kwargs, "eager" if backend is None else backend, mend)
    if backend is None:  # captured only: eager ran the graphs, which places nothing
        for g in result.graphs:
            g.placements, g.measurements = [], []
    return result


def capture(
    model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any = "eager", mend: bool = True
) -> tuple[Any, ExplainReport]:
    """One call of ``model`` captured (Dynamo's caches reset before and after): what it returned, and the
    report of the capture torchmux keeps. With ``mend``, the rewritten code is captured; where that
    capture leaves open whether the code as written would break less (``frontends/mend/verdict.py``
    ``in_doubt``), the code as written is captured too, on copies of the model and inputs, and the
    rewrites are kept only if they broke no more and took no more than twice its capture time
    (``verdict.keep``); otherwise the report is the code-as-written capture's, saying why."""
    from ..frontends.mend import mended, verdict

    global _WARM
    warm, _WARM = _WARM, True
    torch._dynamo.reset()
    try:
        start = time.perf_counter()
        with mended(model, mend) as (target, rewrites):  # the user's modules get their own methods back after
            compiled, recorder = compile_recorded(target, backend, mend)
            out = compiled(*args, **kwargs)
        seconds = time.perf_counter() - start
    finally:
        torch._dynamo.reset()
    result = report(recorder)
    stacks = _break_stacks(recorder, result.not_captured)
    said = [r.reason for r in (*result.break_reasons, *result.not_captured)]
    if not mend or not verdict.in_doubt(stacks, rewrites.keys, said):
        return out, result
    try:
        original, original_seconds = _capture_copy(model, args, kwargs, mend=False)  # its breaks and time only
    except Exception:  # noqa: BLE001 -- the code as written fails to capture or to copy: keep the rewrites
        return out, result
    finally:
        torch._dynamo.reset()
    why = verdict.keep(
        verdict.Capture(result.graph_break_count + len(result.not_captured), seconds, result.graph_count),
        verdict.Capture(
            original.graph_break_count + len(original.not_captured), original_seconds, original.graph_count
        ),
        timed=warm and backend == "eager",  # another backend's time holds its compiles and measurements
    )
    if why:
        original.reverted = [why, *rewrites.applied]
        return out, original
    return out, result


#: a capture ran in this process before: the next one's seconds are not its first-time imports
_WARM = False


def verdict_of(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], recorder: Recorder, rewrites: Any) -> str:
    """compile()'s verdict on the mend pass after a first call captured with ``recorder``: "" to keep
    the rewritten code, else why the code as written is captured instead (``frontends/mend/verdict.py``).
    Only where that capture leaves it in doubt are both forms captured again, on copies (eager backend,
    output silenced), to compare breaks and capture times; Dynamo's caches are not reset (the user's
    other compiled models keep theirs)."""
    from ..frontends.mend import verdict

    reasons = break_reasons_of(recorder.graphs)
    skipped = not_captured(recorder, reasons)
    stacks = _break_stacks(recorder, skipped)
    if not verdict.in_doubt(stacks, rewrites.keys, [r.reason for r in (*reasons, *skipped)]):
        return ""
    captures = []
    try:
        for mend in (True, False):
            found, seconds = _capture_copy(model, args, kwargs, mend)
            captures.append(
                verdict.Capture(found.graph_break_count + len(found.not_captured), seconds, found.graph_count)
            )
    except Exception:  # noqa: BLE001 -- a form that fails to capture or to copy: keep the rewrites
        return ""
    return verdict.keep(captures[0], captures[1])


def _capture_copy(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mend: bool) -> tuple[ExplainReport, float]:
    """One capture of copies of ``model`` and its inputs, run only to be measured (eager backend, output
    silenced, random state restored): its report and its seconds. ``mend`` False captures the code as
    written, also where the model already holds mended methods (a compiled model's)."""
    from ..frontends.mend import unmend, verdict

    m, a, k = verdict.copies(model, args, kwargs)
    if not mend:
        unmend(m)  # a copy of a compiled model holds the mended methods bound to it
    with verdict.shadowed():
        start = time.perf_counter()
        compiled, recorder = compile_recorded(m, "eager", mend)
        compiled(*a, **k)
        seconds = time.perf_counter() - start
    return report(recorder, []), seconds


def _break_stacks(recorder: Recorder, skipped: list[BreakReason]) -> list[list[tuple[str, int]]]:
    """Each break's frames (file, line), outermost first, and each frame run outside the graphs."""
    stacks = [
        [(f.filename, f.lineno or 0) for f in g.break_reason.user_stack]
        for g in recorder.graphs
        if g.break_reason is not None and getattr(g.break_reason, "graph_break", False) and g.break_reason.user_stack
    ]
    return stacks + [[(r.filename, r.lineno)] for r in skipped]


# --- what Dynamo did not capture: skipped frames, recompile limits, graphs run eagerly -----------------


def _unsupported_now() -> tuple[int, int, dict[str, int]]:
    """Dynamo's own tallies: frames seen, frames captured, and each "unsupported" message."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"], counters["frames"]["ok"], dict(counters["unimplemented"])


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def not_captured(recorder: Recorder, breaks: list[BreakReason]) -> list[BreakReason]:
    """Why code ran outside every graph, each with the user's file:line: the frames Dynamo skipped
    (the reasons Dynamo tallied since ``compile_recorded`` that are not a recorded graph break), the
    frames Dynamo failed on (run as plain Python: ``frontends/dynamo.py`` ``SUPPRESSED``) and the
    graphs torchmux could not normalize (they ran as Dynamo captured them)."""
    out: list[BreakReason] = []
    before = getattr(recorder, "unsupported_before", None)
    if before is not None:
        total, ok, messages = _unsupported_now()
        skipped = (total - before[0]) - (ok - before[1])
        known = {r.reason.strip().splitlines()[0] for r in breaks if r.reason.strip()}
        seen: set[str] = set()
        for message, n in messages.items():
            first = message.strip().splitlines()[0] if message.strip() else "?"
            if skipped <= 0 or n <= before[2].get(message, 0) or first in known or first in seen:
                continue
            seen.add(first)
            where = _FILE_LINE.findall(message)
            filename, line = (
                (where[-1][0], int(where[-1][1])) if where else _entry_place(getattr(recorder, "entry", None))
            )
            detail = next((x.strip() for x in message.splitlines()[1:] if x.strip().startswith("Explanation:")), "")
            out.append(
                BreakReason(f"frame skipped by Dynamo: {first}" + (f" ({detail})" if detail else ""), filename, line)
            )
        if 0 < skipped < len(out):  # Dynamo tallied more reasons than frames it skipped: one entry a frame
            last = out[skipped - 1]
            merged = "; then ".join(r.reason.removeprefix("frame skipped by Dynamo: ") for r in out[skipped - 1 :])
            out[skipped - 1 :] = [BreakReason(f"frame skipped by Dynamo: {merged}", last.filename, last.lineno)]
    for frame in SUPPRESSED[getattr(recorder, "suppressed_before", len(SUPPRESSED)) :]:
        message = frame.reason.split(": ", 1)[-1]
        tallied = [i for i, r in enumerate(out) if message in r.reason]
        if tallied:  # Dynamo tallied it too (with its explanation): keep that, at the line that failed
            out[tallied[0]] = BreakReason(out[tallied[0]].reason, frame.filename, frame.lineno)
        else:
            out.append(
                BreakReason(f"frame skipped: Dynamo failed on it ({frame.reason})", frame.filename, frame.lineno)
            )
    for g in recorder.graphs:
        if g.error:
            filename, line = _graph_place(g)
            out.append(
                BreakReason(f"graph {g.index} ran eagerly (torchmux could not normalize it: {g.error})", filename, line)
            )
    return out


def _entry_place(model: Any) -> tuple[str, int]:
    fn = getattr(model, "forward", model)
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else ("?", 0)


def _graph_place(g: CapturedGraph) -> tuple[str, int]:
    for n in g.dynamo_gm.graph.nodes:
        where = _FILE_LINE.findall(n.meta.get("stack_trace") or "")
        if where:
            return where[-1][0], int(where[-1][1])
    return "?", 0
