"""Run a corpus program eagerly and captured, and compare everything the user can see.

``run(program, mode)`` returns a :class:`Result`: graph count, break count (distinct break sites), and
whether the captured run matched eager Python: the outputs (as torchmux itself tests an answer,
``core/compare.py``: float32 to rtol 2e-4 with an absolute term that scales with the output's peak), the
printed text, the log records (level, file, line, message), the warnings raised from the corpus file
(category, line, message) and any exception (type and message). Random draws are compared under the same
seed.

Modes:
- ``torchmux``: ``torchmux.explain`` machinery with the mend pass (source rewrites and Dynamo switches);
- ``torchmux-nomend``: the same with ``mend=False``;
- ``rewrites-only`` / ``switches-only``: one half of the mend pass (for measuring what each gives);
- ``dynamo``: ``torch._dynamo.explain`` for the counts, ``torch.compile(backend="eager")`` for the outputs.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchmux.api.explain import capture, compile_recorded, report
from torchmux.core.compare import mismatch
from torchmux.frontends import mend as mend_module
from torchmux.frontends.mend import switches as switches_module
from torchmux.frontends.mend import verdict

MODES = ("torchmux", "torchmux-nomend", "rewrites-only", "switches-only", "dynamo")
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS_FILES = {os.path.join(HERE, "programs.py"), os.path.join(HERE, "research.py")}  # their warnings are compared


@dataclass
class Result:
    name: str
    mode: str
    graphs: int
    breaks: int  # distinct break sites, plus the frames Dynamo skipped whole
    correct: bool
    why: str = ""  # what differed, when not correct
    rewrites: tuple[str, ...] = ()
    unnormalized: tuple[str, ...] = ()  # graphs torchmux could not normalize to its IR (they ran as captured)
    capture_s: float = 0.0  # the first compiled call: mending (if any), tracing and compiling, and running once
    slower_rewrites: bool = False  # the verdict captured the code as written: the rewrites' capture took over 2x

    @property
    def full_graph(self) -> bool:
        return self.graphs == 1 and self.breaks == 0


@dataclass
class Seen:
    output: Any
    error: tuple[str, str] | None
    text: str


@contextlib.contextmanager
def _observe() -> Iterator[list[str]]:
    """Collect stdout, the corpus logger's records and the corpus file's warnings, in order."""
    lines: list[str] = []
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("LOG %(levelname)s %(filename)s:%(lineno)d %(funcName)s %(message)s"))
    logger = logging.getLogger("torchmux.corpus")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    out = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    lines.append(out.getvalue())
    lines.append(stream.getvalue())
    lines += [
        f"WARN {w.category.__name__} {os.path.basename(w.filename)}:{w.lineno} {w.message}"
        for w in caught
        if os.path.abspath(w.filename) in CORPUS_FILES
    ]


def observe(fn: Any, args: tuple[Any, ...], seed: int = 0) -> Seen:
    torch.manual_seed(seed)
    with _observe() as lines:
        try:
            out, error = fn(*args), None
        except Exception as e:  # the program's own exception is part of what it does
            out, error = None, (type(e).__name__, str(e))
    return Seen(out, error, "\n".join(lines))


def same(a: Seen, b: Seen) -> str:
    """ "" if the two runs look the same to the user, else what differed."""
    if a.error != b.error:
        return f"exception {a.error} != {b.error}"
    if a.text != b.text:
        return f"text {a.text!r} != {b.text!r}"
    ta, tb = _tensors(a.output), _tensors(b.output)
    if len(ta) != len(tb):
        return "different outputs"
    for x, y in zip(ta, tb):  # torchmux's own test of an answer (core/compare.py): its atol scales with the output
        differs = mismatch([y], [x])
        if differs:
            return f"output differs ({differs})"
    return ""


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.detach()]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    if hasattr(out, "to_tuple"):
        return _tensors(out.to_tuple())
    return [torch.tensor(out)] if isinstance(out, (int, float)) else []


@contextlib.contextmanager
def _half(mode: str) -> Iterator[None]:
    """Turn off one half of the mend pass (measurement only)."""
    if mode == "rewrites-only":
        saved = switches_module.switches
        switches_module.switches = contextlib.nullcontext  # type: ignore[assignment]
        try:
            yield
        finally:
            switches_module.switches = saved
    elif mode == "switches-only":
        saved_mend = mend_module.mend
        mend_module.mend = lambda model: (model, [])  # type: ignore[assignment]
        try:
            yield
        finally:
            mend_module.mend = saved_mend
    else:
        yield


def _frames_skipped() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"] - counters["frames"]["ok"]


def run_model(
    model: Any, args: tuple[Any, ...], mode: str = "torchmux", backend: str = "eager"
) -> tuple[Seen, Any, int, float]:
    """Capture ``model`` once in ``mode``; return what the captured run showed, its report (or explain
    output), how many frames Dynamo skipped whole, and the seconds the first compiled call took."""
    torch._dynamo.reset()
    try:
        if mode == "dynamo":
            with _observe():  # this run is only counted; its text is not compared
                explained = torch._dynamo.explain(model)(*copy.deepcopy(args))
            torch._dynamo.reset()
            skipped = _frames_skipped()
            start = time.perf_counter()
            seen = observe(torch.compile(model, backend="eager"), args)
            seconds = time.perf_counter() - start
            return seen, explained, _frames_skipped() - skipped, seconds
        use_mend = mode != "torchmux-nomend"
        start = time.perf_counter()
        if mode == "torchmux":  # as torchmux.explain captures: the rewrites kept only where no worse
            kept: list[Any] = []
            seen = observe(lambda *a: _first(kept, capture(model, a, {}, backend)), args)
            rep = kept[0]
            return seen, rep, sum("frame skipped" in r.reason for r in rep.not_captured), time.perf_counter() - start
        with _half(mode), mend_module.mended(model, use_mend) as (target, _):
            compiled, recorder = compile_recorded(target, backend, use_mend)
            seen = observe(compiled, args)
        seconds = time.perf_counter() - start
        rep = report(recorder)
        return seen, rep, sum("frame skipped" in r.reason for r in rep.not_captured), seconds
    finally:
        torch._dynamo.reset()


def _first(kept: list[Any], pair: tuple[Any, Any]) -> Any:
    kept.append(pair[1])
    return pair[0]


def run(program: Any, mode: str = "torchmux") -> Result:
    model, args = program.build()
    if isinstance(model, torch.nn.Module):
        model.eval()
    reference = observe(model, copy.deepcopy(args))
    if isinstance(model, torch.nn.Module) and hasattr(model, "calls"):
        model.calls = 0  # AttributeMutation counts its calls: start the captured run from the same state
    seen, rep, skipped, seconds = run_model(model, copy.deepcopy(args), mode)
    why = same(reference, seen)
    if mode == "dynamo":
        graphs, breaks, rewrites = (
            rep.graph_count,
            len({repr(r.user_stack[-1]) if r.user_stack else r.reason for r in rep.break_reasons}),
            (),
        )
    else:
        graphs, breaks, rewrites = rep.graph_count, rep.graph_break_count, tuple(rep.rewrites)
    errors = tuple(g.error for g in getattr(rep, "graphs", []) if getattr(g, "error", None))
    slower = any("rewritten capture took" in r for r in getattr(rep, "reverted", ()))
    return Result(program.name, mode, graphs, breaks + skipped, not why, why, rewrites, errors, seconds, slower)


def capture_seconds(program: Any, use_mend: bool) -> float:
    """Seconds of the first call of ``program`` under ``torch.compile(backend="eager")``: Dynamo's capture
    alone, or with the mend pass before it (rewrites and switches), the same way torchmux runs it, plus,
    where the rewritten capture leaves in doubt whether it is worse than Dynamo's on the code as written
    (``frontends/mend/verdict.py``), the capture of the code as written that decides (as explain takes it).
    torchmux's own graph normalization is left out: this measures the capture frontend only."""
    model, args = program.build()
    if isinstance(model, torch.nn.Module):
        model.eval()
    torch._dynamo.reset()
    reasons: list[Any] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        reasons.append(getattr(gm, "compile_subgraph_reason", None))
        return gm.forward

    try:
        start = time.perf_counter()
        with mend_module.mended(model, use_mend) as (target, rewrites):
            compiled = torch.compile(target, backend=recording if use_mend else "eager")
            observe(mend_module.scoped(compiled) if use_mend else compiled, args)
        stacks = [
            [(f.filename, f.lineno or 0) for f in r.user_stack]
            for r in reasons
            if r is not None and getattr(r, "graph_break", False) and r.user_stack
        ]
        said = [r.reason for r in reasons if r is not None and getattr(r, "graph_break", False)]
        if use_mend and verdict.in_doubt(stacks, rewrites.keys, said):
            torch._dynamo.reset()
            m, a, _ = verdict.copies(model, args, {})
            with verdict.shadowed():
                observe(torch.compile(m, backend="eager"), a)
        return time.perf_counter() - start
    finally:
        torch._dynamo.reset()


def capture_pair(program: Any, before_each: Callable[[], Any] = lambda: None) -> tuple[float, float]:
    """The best of two first-call timings each, with mend and without, in the order A B B A (fair to both).
    ``before_each`` runs before each capture (a caller's time limit, armed anew for each)."""
    times = []
    for use_mend in (True, False, False, True):
        before_each()
        times.append(capture_seconds(program, use_mend))
    return min(times[0], times[3]), min(times[1], times[2])
