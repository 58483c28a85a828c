"""Pick a backend for a graph by measurement, never by trust.

For one graph and the real inputs of its first call:

0. leave out what cannot win (screen.py, applied by the runner): in the default mode a backend that
   needs tuning on this device (TVM on the CPU) is not built, unless this machine saw it come within
   1.5x of the winner on a graph with the same ATen ops; ``mode="max-autotune"`` builds everything.
   Inference graphs arrive frozen (freeze.py): weights are constants of the graph;
1. run the reference interpreter once: that is the answer;
2. compile every candidate backend (its claimed ops on it, the rest eagerly, see partition.py);
3. run each once and compare with the answer (core/compare.py): a wrong answer is a failure;
4. screen: a candidate whose best warm call is several times slower than the best candidate's cannot
   win; it keeps that figure and is not timed further (an untuned TVM graph at 30x eager would
   otherwise eat the budget, and its long runs evict the others' weights from the caches);
5. time the rest in rounds (every round times each once, in a new random order, so machine noise
   and cache effects hit them alike). A sample is a burst of back-to-back calls after untimed ones
   (:data:`SWITCH_SECONDS` of them), the way the graph runs in a model called in a loop: with one call
   per sample, each candidate would be timed on caches the previous one had just emptied, and beside
   threads it left spinning. Take medians;
6. choose the fastest correct candidate; medians within :data:`TIE` of the fastest are a tie, broken
   by :func:`choose` (fewer ops left to eager, then the steadier latency).

A candidate that fails to compile, crashes or answers wrong gets an infinite cost and a recorded
reason (Triton's autotuner treats failures the same way). It never reaches the user: eager is always a
candidate, and it is the reference's own ops.

A candidate's compile and first two (checked) calls run in a worker thread given ``trial_deadline``
seconds (``options={"trial_deadline": S}`` or ``TORCHMUX_TRIAL_DEADLINE``; default 30, 300 under
``mode="max-autotune"``: core/settings.py ``TRIAL_DEADLINE_SECONDS``): past it the
candidate fails as "timed out after S s" and the thread is abandoned (:func:`within_deadline`). This
covers every candidate, isolated in a child first or not (isolate.py). A call that hangs *later* --
while timed, or once chosen, in the :class:`~torchmux.autotune.guard.Guard` that runs the user's calls --
is not covered: that call is the user's own, made in the user's thread.
"""

from __future__ import annotations

import math
import queue
import random
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch

from ..core import settings
from ..core.backend import ESTIMATE_SKIP_FACTOR, Backend, CompileRequest
from ..core.ir import GraphIR
from .placement import Placement, build_placement
from .verify import check_call, clone_inputs

T = TypeVar("T")


@dataclass
class Measurement:
    """One candidate's result. ``seconds`` is the median latency, ``inf`` when it failed, NaN when it
    was not timed (a named backend, the one candidate left, a remembered winner)."""

    backend: str
    seconds: float
    ok: bool
    reason: str = ""
    compile_seconds: float = 0.0
    placement: Placement | None = None
    samples: list[float] = field(default_factory=list)
    quiet: bool = False  # a failure this process warned about already, on a graph of the same structure

    @property
    def summary(self) -> str:
        if not self.ok:
            return f"{self.backend}: failed ({self.reason})"
        p = self.placement
        split = f", {p.eager_summary}" if p and p.ops_eager else ""
        if self.seconds != self.seconds:  # NaN: checked, never raced against another candidate
            return f"{self.backend}: correct, not timed{split}"
        return f"{self.backend}: {self.seconds * 1e3:.3f} ms{split}"


@dataclass
class Decision:
    chosen: Measurement
    measurements: list[Measurement]

    @property
    def backend(self) -> str:
        return self.chosen.backend


def _sync(args: Sequence[Any]) -> None:
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()


def _time_once(fn: Callable[..., Any], args: Sequence[Any]) -> float:
    _sync(args)
    t0 = time.perf_counter()
    fn(*args)
    _sync(args)
    return time.perf_counter() - t0


def short_error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    loc = f" at {where.filename.split('/')[-1]}:{where.lineno}" if where else ""
    return f"{type(e).__name__}: {first[:300]}{loc}"


def measure(
    ir: GraphIR,
    backends: Sequence[Backend],
    args: Sequence[Any],
    *,
    mode: str | None = None,
    options: Callable[[str], dict[str, Any]] = lambda name: {},
    time_budget: float = 0.5,
    max_rounds: int = 25,
    timed: bool = True,
    progress: Callable[[str, str], None] | None = None,
    deadline: float | None = None,
    program: Any = None,
) -> list[Measurement]:
    """Compile, check and (if ``timed``) time every backend on ``args``. Never raises for a backend's fault.
    ``progress(candidate, "compile" | "time")`` is called as each step starts (autotune/progress.py).
    ``deadline``: seconds a candidate's compile and first checked calls may take (default
    ``TORCHMUX_TRIAL_DEADLINE``); see :func:`within_deadline`. ``program``: the ``ExportedProgram`` ``ir``
    was normalized from (``torchmux.export``), handed to each backend in its request."""
    # trials never touch the user's tensors; parallel ATen ops run in the caller's thread (in_own_thread)
    args, reference = on_caller(lambda: _reference(ir, args))
    limit = settings.TRIAL_DEADLINE.get() if deadline is None else deadline
    results: list[Measurement] = skipped_by_estimate(ir, backends, args, mode, options)
    live: list[tuple[Measurement, Callable[..., Any]]] = []
    for backend in backends:
        if progress:
            progress(backend.name, "compile")
        if any(m.backend == backend.name for m in results):
            continue
        try:  # a compile or first call that never returns costs the deadline, not the program
            m = within_deadline(
                partial(_trial, ir, backend, args, reference, mode, options(backend.name), program), limit
            )
        except TrialTimeout:
            m = Measurement(
                backend.name, math.inf, False, f"timed out after {limit:g} s (compile and first checked calls)"
            )
        results.append(m)
        if m.ok and m.placement is not None:
            live.append((m, m.placement.fn))

    if timed and len(live) > 1:
        for m, _ in live:
            if progress:
                progress(m.backend, "time")
        time_rounds(live, args, time_budget, max_rounds)
    else:  # untimed: what the first checked calls took (compare included) is no latency to report or keep
        for m, _ in live:
            m.seconds = math.nan
    return results


def _reference(ir: GraphIR, args: Sequence[Any]) -> tuple[list[Any], Sequence[Any]]:
    args = clone_inputs(args, ir.input_kinds)
    return args, ir.run_reference(*clone_inputs(args, ir.input_kinds))


def _trial(
    ir: GraphIR,
    backend: Backend,
    args: Sequence[Any],
    reference: Sequence[Any],
    mode: str | None,
    options: dict[str, Any],
    program: Any = None,
) -> Measurement:
    """Compile ``backend`` on ``ir`` and check its first two calls against ``reference``."""
    t0 = time.perf_counter()
    try:
        placement = build_placement(ir, backend, args, mode=mode, options=options, program=program)
    except Exception as e:
        return Measurement(backend.name, math.inf, False, f"compile failed: {short_error(e)}", time.perf_counter() - t0)
    m = Measurement(backend.name, math.inf, False, "", placement.compile_seconds, placement)
    try:  # on copies of the user's inputs, twice (verify.py: inputs and reused buffers are part of the answer)
        t1 = time.perf_counter()
        _, wrong = check_call(ir, placement.fn, args, twice=True, reference=reference)
        first = time.perf_counter() - t1  # also the warm-up
    except Exception as e:
        m.reason = f"crashed: {short_error(e)}"
        return m
    if wrong:
        m.reason = wrong
        return m
    m.ok, m.seconds = True, first
    return m


_CALLER = threading.local()  # .submit in a thread started by in_own_thread: runs work in its caller's thread


def in_own_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` in a fresh thread (a compiler that traces needs thread-local state the caller may not
    have clean), except what runs parallel ATen ops outside a trial: :func:`time_rounds` and the
    reference run (:func:`on_caller`) called from that thread run back in this one, which serves them
    while waiting. Exceptions reach the caller.

    Timing belongs in the thread the model's calls come from. With torch at 2+ threads, a parallel ATen
    op or Inductor kernel run from a second thread, once the caller's thread has its own OpenMP team,
    waits on workers that no longer spin (libgomp shortens its spin when it manages more threads than
    there are cores): 67 us against 26 for the same op (200K elements, 2 threads), and GPT-2's graph at
    batch 1 was timed at 5.0 ms on Inductor in the tuner's thread against 1.0 ms in the caller's. ONNX
    Runtime's own pool is not slowed, so auto chose it at 2 threads where Inductor was faster. The same
    holds for the caller's thread while any other thread with a team of its own is alive, so the
    tuner's thread runs no parallel op itself: trials run in short-lived threads (:func:`within_deadline`),
    whose teams end with them.
    """
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    box: dict[str, Any] = {}

    lock, state = threading.Lock(), {"serving": True}

    def submit(job: Callable[[], Any]) -> Any:
        done, out = threading.Event(), dict[str, Any]()
        with lock:
            if not state["serving"]:  # the caller left (an interrupt): nobody would run it there
                return job()
            jobs.put((job, out, done))
        done.wait()
        if "error" in out:
            raise out["error"]
        return out.get("value")

    def run() -> None:
        _CALLER.submit = submit
        try:
            box["value"] = work()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e
        finally:
            jobs.put(None)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    try:
        while (item := jobs.get()) is not None:
            job, out, done = item
            try:
                with torch.no_grad():  # as the tuner's thread runs (runner.py)
                    out["value"] = job()
            except BaseException as e:
                out["error"] = e
            finally:
                done.set()
    finally:  # normally the queue is empty here; after an interrupt the thread must not wait on us
        with lock:
            state["serving"] = False
        while True:
            try:
                item = jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1]["error"] = RuntimeError("the caller stopped waiting")
                item[2].set()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def on_caller(job: Callable[[], T]) -> T:
    """``job()`` in the caller's thread of :func:`in_own_thread` when called from its thread, else here."""
    submit = getattr(_CALLER, "submit", None)
    return job() if submit is None else submit(job)


class TrialTimeout(Exception):
    """A trial ran past its deadline (:func:`within_deadline`)."""


def within_deadline(work: Callable[[], T], seconds: float) -> T:
    """``work()``, run in a daemon thread that is waited for at most ``seconds``; raises TrialTimeout after that.

    Python cannot stop a thread: a trial past its deadline is abandoned, still running (or blocked)
    in the background until the process exits, and whatever it holds (memory, a lock inside the
    backend) stays held. It runs on copies of the user's inputs, so it never writes to theirs.
    The thread gets the caller's grad mode (thread-local in torch); exceptions reach the caller.
    """
    box: dict[str, Any] = {}
    grad = torch.is_grad_enabled()

    def run() -> None:
        try:
            with torch.set_grad_enabled(grad):
                box["value"] = work()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="torchmux-trial", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TrialTimeout(f"timed out after {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def skipped_by_estimate(
    ir: GraphIR,
    backends: Sequence[Backend],
    args: Sequence[Any],
    mode: str | None,
    options: Callable[[str], dict[str, Any]],
) -> list[Measurement]:
    """Candidates not worth compiling: their own cost estimate (``Backend.estimate_seconds``) is
    ESTIMATE_SKIP_FACTOR times the best estimate or worse. Backends without an estimate are never skipped."""
    estimates: dict[str, float] = {}
    for b in backends:
        try:
            guess = (
                b.estimate_seconds(CompileRequest(ir, list(args), mode, options(b.name)))
                if hasattr(b, "estimate_seconds")
                else None
            )
        except Exception:  # an estimate that fails is no estimate
            guess = None
        if isinstance(guess, (int, float)) and guess >= 0 and not math.isnan(guess):
            estimates[b.name] = float(guess)
    if len(backends) < 2 or len(estimates) < 2:
        return []
    best_name = min(estimates, key=estimates.__getitem__)
    best = estimates[best_name]
    return [
        Measurement(
            name,
            math.inf,
            False,
            f"skipped: its estimate {sec * 1e3:.3g} ms is {ESTIMATE_SKIP_FACTOR:g}x+ {best_name}'s {best * 1e3:.3g} ms",
        )
        for name, sec in estimates.items()
        if sec >= ESTIMATE_SKIP_FACTOR * best and sec > 0
    ]


SCREEN_FACTOR = 3.0  # a candidate this many times slower than the best one's warm call is not timed further
#: a sample is a burst of back-to-back calls that lasts about this long: the bench's samples (bench/run.py).
#: At 2 ms (one call of a 4 ms graph) ONNX Runtime's two-thread calls of the zoo's pointwise chain timed
#: 3.1-8.7 ms from one process to the next, and auto ran it where Inductor was 1.2-1.3x faster in a loop
SAMPLE_SECONDS = 1e-2
#: untimed calls before each sample last at least this long: torch's OpenMP workers spin ~4 ms after a
#: parallel op, and at two threads on two cores the candidate timed after a torch-based one shared a core
#: with them (the bench's samples, timed that way, came out bimodal: BERT's Inductor 0.58 or 0.95-1.25 ms at
#: batch 1). The candidate's own calls fill the time: a sleep would let the idle core park, and waking it is
#: slow (a 20 ms sleep before each sample cost ONNX Runtime's non-spinning pool 1.7x on the next one)
SWITCH_SECONDS = 6e-3


def time_rounds(
    live: list[tuple[Measurement, Callable[..., Any]]], args: Sequence[Any], time_budget: float, max_rounds: int
) -> None:
    """Step 5 of the module docstring: sets each live candidate's ``seconds`` (median) and ``samples``.

    Runs in the thread that called the compiled model when the tuner works in a thread of its own
    (:func:`in_own_thread`): see there."""
    on_caller(partial(_time_rounds, live, args, time_budget, max_rounds))


def _time_rounds(
    live: list[tuple[Measurement, Callable[..., Any]]], args: Sequence[Any], time_budget: float, max_rounds: int
) -> None:
    for m, fn in live:  # warm-up, and an estimate for screening and burst sizes
        try:
            m.seconds = min(m.seconds, _time_once(fn, args), _time_once(fn, args))
        except Exception as e:
            m.ok, m.seconds, m.reason = False, math.inf, f"crashed while timed: {short_error(e)}"
    best = min((m.seconds for m, _ in live if m.ok), default=math.inf)
    contenders = [(m, fn) for m, fn in live if m.ok and m.seconds <= SCREEN_FACTOR * best]
    for m, _ in live:
        if m.ok and m.seconds > SCREEN_FACTOR * best:
            m.samples = [m.seconds]  # its best warm call: slower than the winner can be
    if len(contenders) < 2:
        return
    calls = {id(m): max(1, min(50, int(SAMPLE_SECONDS / max(m.seconds, 1e-7)))) for m, _ in contenders}
    per_round = sum(calls[id(m)] * m.seconds + max(m.seconds, SWITCH_SECONDS) for m, _ in contenders)
    rounds = max(3, min(max_rounds, int(time_budget / max(per_round, 1e-6))))
    order = list(contenders)
    shuffle = random.Random(0).shuffle  # seeded: the same graph is timed the same way in every process
    for _ in range(rounds):
        shuffle(order)
        for m, fn in order:
            if not m.ok:
                continue
            n = calls[id(m)]
            try:
                m.samples.append(sample_seconds(fn, args, n))
            except Exception as e:  # a candidate that crashes only sometimes is not trusted
                m.ok, m.reason = False, f"crashed while timed: {short_error(e)}"
    for m, _ in contenders:
        m.seconds = statistics.median(m.samples) if m.ok and m.samples else math.inf


def sample_seconds(fn: Callable[..., Any], args: Sequence[Any], calls: int) -> float:
    """One sample (step 5), seconds per call: untimed calls for at least :data:`SWITCH_SECONDS` (the
    caches are the previous candidate's, and its threads may still spin), then ``calls`` back-to-back
    calls, timed. The bench times its systems with it too (bench/run.py)."""
    switch_until = time.perf_counter() + SWITCH_SECONDS
    _time_once(fn, args)
    while time.perf_counter() < switch_until:
        _time_once(fn, args)
    _sync(args)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    _sync(args)
    return (time.perf_counter() - t0) / calls


#: medians this close to the fastest (relative) are a tie: this machine's noise between rounds is larger
TIE = 0.03


def choose(results: Sequence[Measurement]) -> Measurement | None:
    """The fastest correct candidate, or None if none is correct.

    Candidates whose median lies within :data:`TIE` of the fastest one's are a tie, and the tie goes to
    (1) the one that leaves fewer ops to eager between its regions (less work outside the backend and
    less Python per call: what a noisy timing cannot see), then (2) the steadier one (smaller spread of
    its samples, q3 - q1 over the median), then (3) the faster median. Untimed candidates (a named
    backend, a remembered winner: median NaN) are taken in order.
    """
    ok = [m for m in results if m.ok]
    if not ok:
        return None
    timed = [m for m in ok if math.isfinite(m.seconds)]
    if not timed:
        return ok[0]
    fastest = min(m.seconds for m in timed)
    tied = [m for m in timed if m.seconds <= fastest * (1 + TIE)]
    return min(tied, key=lambda m: (m.placement.ops_eager if m.placement else 0, _spread(m), m.seconds))


def _spread(m: Measurement) -> float:
    """q3 - q1 of the samples over their median (0 with fewer than 4 samples)."""
    if len(m.samples) < 4 or not m.seconds > 0:
        return 0.0
    q = statistics.quantiles(m.samples, n=4)
    return (q[2] - q[0]) / m.seconds
