"""Verification that lasts: when a chosen backend's answer is checked again, and what a check looks at.

**The checking policy** (``options={"verify": ...}``), per graph and input signature:

- ``"off"`` (or ``False``): a named backend is trusted from its first call (auto still checks each
  candidate once while it measures them: a wrong candidate cannot win).
- ``"first"``: the first call is checked, later calls are trusted (torchmux before 0.x did this).
- ``"sparse"`` (the default; ``True`` means it): the first call, call 8, then calls 16, 32, ... 8192
  and every 8192nd call as the check budget below allows, and any call whose inputs are *of a new
  kind*: a user input holds NaN or ±inf for
  the first time, or its largest magnitude falls in a power-of-16 band not seen before (a backend may
  be right on N(0, 1) values and wrong on 1e6). Telling the kind costs one reduction per floating user
  input per call (``torch.aminmax(x)``: the smallest and largest value in one pass, NaN if any value is
  NaN; two numbers to read back); inputs that cannot hold floats and parameters are not scanned.
  A graph holding an op its backend's claims list as ``nonfinite_unsafe`` (the conformance suite's
  NaN/±inf variants differ from eager, e.g. TVM's relu, ORT's amax) is checked on *every* call whose
  inputs hold NaN or ±inf, not only the first such call.
- ``"always"``: every call (for debugging a backend).

**One schedule per graph in a process** (:class:`Schedule`, :func:`schedule_for`): the calls counted,
the kinds of input seen and the budget's account belong to the graph (its fingerprint), the input
signature, the backend and the policy, not to one build of it. After ``torch._dynamo.reset()`` and a
recompile (or the same code compiled twice) the new build's *first* call is checked (a new build's
first answer; it is the call that compiled it, and its check is not weighed against the budget), and
the schedule goes on from the calls the graph already had: a graph past call 1,000 checks next at
1,024, not at 8 again.

**What a check costs, and the budget** (the sparse policy's bound at every point of a run, not only in
the steady state). A check is one run of the graph's own ATen code on one thread (an eager call), a copy
of the user inputs, the backend's call on it and the comparison (core/compare.py: a few passes in the
outputs' precision). Measured (``python -m torchmux.bench.scripts.check_cost``, one thread, batch 1,
ONNX Runtime chosen but on T5, Inductor), a check answering its call: 1.3-2.1 eager calls beyond the
call on eight of the zoo's nine models, 4.0 on the MLP, whose 6 MB of weights the reference reads
while ONNX Runtime's own packed copy is evicted from the CPU's caches (the two alternating take 1.5
ms where each alone takes 0.5 and 0.2):
what two implementations of one graph cost side by side, not a copy or a comparison. Where a second
CPU allows, the scheduled checks run beside the call instead (below). The schedule is where the
whole cost is bounded. Calls 1 and 8 (:data:`ALWAYS`) are checked whatever they cost; call 1 is
inside the call that compiles (its check is part of the compile's cost, not weighed). Every scheduled
check after call 8 (:data:`BUDGET_AFTER`) is taken only once the checks so far, that one included (at the
last check's cost), cost at most :data:`CHECK_BUDGET` (2.5%) of the time the graph's calls took (the
backend's own call, timed :data:`PROBE_AFTER` calls after each check; the user's call, with Dynamo's and
torchmux's work around it, is longer, so the share of the user's time is smaller still); until then it is
postponed, never dropped. A new kind of input and the ``nonfinite_unsafe`` rule are never postponed.
So over a graph's first N calls (N >= 8; call 1 aside) the checks add at most the check at call 8 plus
2.5% of the calls' time: measured on the zoo at one thread, batch 1, auto's mean call over its first
100 calls is 1.020-1.047x its steady state and over the first 1,000 1.005-1.015x (the zoo's nine
models; it was 1.09-1.16x and 1.006-1.017x on mlp, pointwise and resnet with calls 2 and 4 also
checked and a 10% budget).

**What is caught, and when** (sparse). A backend whose answers go wrong from call k on, on inputs of a
kind already seen, is caught at the first check at or after call k (the trial's two checked calls
come before call 1): for k <= 8 at call 8 (at most 7 wrong answers); later at the next call of the
schedule (at most 2k up to 8192, then within 8192 calls) unless the budget postponed it, to no later
than the call where the checks so far fit in 2.5% of the time: a check costing c calls of the graph,
with C checks made after call 1, waits until about call 40 * c * (C + 1). The schedule's doubling
outgrows that after a few checks: with c = 2, checks fall at 1, 8, 160, 256, 512, 1024, ...; on the
zoo at batch 1 (check_cost prints them) the first check after call 8 fell at calls 170-803. Inputs
of a new kind (the first NaN, the first inf, a new magnitude band) are checked on their first call
whatever the budget. Every wrong answer
caught by a check that answers its call is answered by the reference; the ones returned before it are
not. A check beside the call (below) answers nothing: the call it checked returned the backend's answer,
and the graph's next call after its verdict is answered by the next candidate (eager at worst).

**Checks beside the call** (:func:`check_beside`). The part of a check that costs (the reference, run
on torch's copy of the weights that the backend's own copy has pushed out of the caches, and the
comparison) need not hold up the user's call: with torch on one thread (how latency-bound serving runs
it) and a second CPU this process may use, a *scheduled* check (call 8 and the schedule's later ones,
not a build's first call, a new kind of input or the ``nonfinite_unsafe`` rule) of a CPU graph whose
inputs are all the user's (a frozen inference graph) runs the backend on copies of the inputs, judges on
the spot what is cheap and must be judged before the user can touch the tensors (a changed input, an
output sharing an input's memory: answered by the reference, as above), returns the backend's answer,
and hands a copy of it and of the inputs to one worker thread (one torch thread; it runs one check at a
time, and a graph's next scheduled check waits for its last verdict). The worker runs the reference and
compares; a wrong answer is acted on by the graph's next call (the demotion, the warning naming the
check's call and how many calls returned the backend's answer since). The budget counts the worker's
CPU time as well: a check costs the machine what it did, and the user's call what the copies and one
call on them cost (on the zoo's MLP at batch 1, 1.1-1.4 eager calls on the user's thread against 4-5
answered in the call; its whole work, 7.6-8.8 eager calls: the worker finds nothing in its caches). With
more torch threads the check answers the call as before: a second thread's work would then take a CPU
from torch's own pool. So, beside the call, a backend wrong from call k is caught at the first check at
or after k, and answered right from the first call after that check's verdict (a reference run later).

**A check** runs the graph's own ATen code (the reference interpreter's ops, without its per-node
bookkeeping) on a copy of the inputs and compares (core/compare.py);
it also fails a candidate that changed a user input the graph does not mutate, returned an output
sharing storage with an input where the reference's output does not, or (a trial's check: it calls
twice) hands back a buffer a later call overwrites. A graph with
random ops (dropout, rand, bernoulli) is compared as random: shapes, dtypes and finiteness, never
values (the generators differ).

**On a mismatch or an exception**: the backend is demoted for this graph and signature (remembered on
disk, see :func:`remember_demotion`), the call is answered by the reference (mismatch) or by the next
correct candidate (exception; eager at worst), and one :class:`TorchmuxFallbackWarning` names the
backend, the graph and the reason.

**Hangs**: the first two checked calls (and the compile) of every candidate run under the trial
deadline (tuner.py ``within_deadline``, isolate.py); a later check runs inside the user's own call
(guard.py) and has no deadline: a backend that hangs there hangs that call (the backend's own call, on
the user's thread, also where the reference runs beside it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import math
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter, thread_time
from typing import Any

import torch

from ..core import settings
from ..core.artifacts import atomic_write
from ..core.compare import mismatch
from ..core.ir import GraphIR, op_name, viewed

POLICIES = ("off", "first", "sparse", "always")
SPARSE_UNTIL = 8192  # calls 16, 32, ..., 8192 are scheduled; after that every SPARSE_EVERY-th
SPARSE_EVERY = 8192
_RNG_WORDS = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson", "exponential")


def policy_of(value: Any) -> str:
    """The policy a ``verify`` option names; raises ValueError for anything else."""
    if value is True or value is None:
        return "sparse"
    if value is False:
        return "off"
    if isinstance(value, str) and value in POLICIES:
        return value
    raise ValueError(
        f"verify={value!r} is not a checking policy; pass one of {', '.join(map(repr, POLICIES))}, True or False"
    )


def scheduled(call: int) -> bool:
    """Whether call number ``call`` (1-based) is on the sparse schedule: 1, 8, 16, 32, ..., 8192, then
    every 8192nd."""
    if call <= SPARSE_UNTIL:
        return call in ALWAYS or (call > ALWAYS[-1] and call & (call - 1) == 0)
    return call % SPARSE_EVERY == 0


#: calls checked whatever they cost: call 1 (inside the call that compiles: the build's first answer)
#: and call 8, so a backend that turns wrong just after its trial is caught by call 8, as plugins.md
#: and the kit promise (tests/testing/test_kit.py)
ALWAYS = (1, 8)
#: the most of a graph's time its scheduled checks after call 8 may take (see the module docstring): a
#: scheduled check past call BUDGET_AFTER waits until the checks so far, itself included, cost at most this
#: share of the calls' time
CHECK_BUDGET = 0.025
BUDGET_AFTER = ALWAYS[-1]
#: the unchecked call timed after each check, for the budget (that many calls after it: the call right
#: after a check runs on caches the reference's run left cold, and would make a call look dearer)
PROBE_AFTER = 2


def within_budget(call: int, cost: float, call_seconds: float, budget: float) -> int:
    """The first call from ``call`` on at which checks costing ``cost`` seconds (beyond the calls they
    answered) are at most ``budget`` of the time the graph's calls took, ``call_seconds`` each."""
    if call_seconds <= 0 or cost <= budget * call * call_seconds:
        return call
    if budget <= 0:
        return sys.maxsize
    return max(call, math.ceil(cost / (budget * call_seconds)))


def next_scheduled(call: int) -> int:
    """The first call after ``call`` that is on the sparse schedule."""
    if call < ALWAYS[-1]:
        return next(c for c in ALWAYS if c > call)
    if call < SPARSE_UNTIL:
        return 1 << call.bit_length()  # the next power of two
    return (call // SPARSE_EVERY + 1) * SPARSE_EVERY


class Schedule:
    """Where one graph's checks stand: the calls made, the kinds of input seen, the next check due and
    what the checks cost. One per graph (fingerprint), input signature, backend and policy in a process
    (:func:`schedule_for`): a graph built again (``torch._dynamo.reset()`` and a recompile, the same code
    compiled twice) goes on from where the first build left it, instead of paying calls 1-8's checks again.
    """

    __slots__ = (
        "calls",
        "checks",
        "kinds",
        "next",
        "spent",
        "call_seconds",
        "probe",
        "last_cost",
        "pending",
        "verdict",
    )

    def __init__(self) -> None:
        self.calls = 0  # the user's calls made on this graph (every build of it)
        self.checks = 0  # checks made in those calls (not the trials')
        self.kinds: set[tuple] = set()  # the kinds of input checked (input_kind)
        self.next = 1  # the next call the sparse schedule checks
        # the check budget: seconds the checks after call 1 cost beyond the calls they answered, what an
        # unchecked call costs (timed at call ``probe``, PROBE_AFTER calls after each check), the last check's cost
        self.spent, self.call_seconds, self.probe, self.last_cost = 0.0, 0.0, 0, 0.0
        # a check beside a call (check_beside): whether one is still running on the checks' worker, and the
        # (reason, call) of one that found a wrong answer, for the graph's next call to act on
        self.pending = False
        self.verdict: tuple[str, int] | None = None


_SCHEDULES: dict[tuple, Schedule] = {}
_SCHEDULES_LOCK = threading.Lock()


def schedule_for(ir: GraphIR, signature: tuple, backend: str, policy: str) -> Schedule:
    """The schedule of ``ir``'s checks for this signature, backend and policy in this process (another
    cache folder, another memory, as verdicts.py's)."""
    key = (str(settings.CACHE_DIR.get()), ir.fingerprint(), repr(signature), backend, policy)
    with _SCHEDULES_LOCK:
        found = _SCHEDULES.get(key)
        if found is None:
            found = _SCHEDULES[key] = Schedule()
        return found


_INF = math.inf
#: the smallest and largest value in one pass (NaN if any is NaN): ~10x faster on the CPU than
#: ``linalg.vector_norm(t, inf)``, whose abs-then-reduce took 5 ms on a 2M-element input (a third of the
#: pointwise model's eager time) and ~7 us on 2K elements, on every call
_RANGE = torch.aminmax
#: ATen runs a reduction on its OpenMP threads above this many elements (``at::internal::GRAIN_SIZE``)
_GRAIN = 32768


def input_kind(args: Sequence[Any], keyed: Sequence[int]) -> tuple:
    """What kind of values the user inputs hold: per floating input, "nan", "inf" or its magnitude band
    (the binary exponent of its largest magnitude, in steps of 4).

    A CPU input large enough for ATen to reduce it in parallel is scanned on one torch thread: a parallel
    scan leaves torch's OpenMP workers spinning for milliseconds, and a backend with a thread pool of its
    own then runs beside them (ONNX Runtime at 2 threads on the zoo's attention block: 8.9 ms a call
    after a parallel scan, 6.3 ms with none). One thread costs a few microseconds on 131K elements."""
    kind = []
    for i in keyed:
        a = args[i]
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point and a.numel():
            a = a.detach() if a.requires_grad else a  # every call: no needless detach
            if a.numel() > _GRAIN and a.device.type == "cpu":
                with one_torch_thread():  # a no-op at one thread
                    lo, hi = _RANGE(a)
            else:
                lo, hi = _RANGE(a)
            low, high = lo.item(), hi.item()
            peak = high if high >= -low else -low  # a NaN compares False both ways: caught below
            kind.append(
                "nan"
                if low != low or high != high
                else "inf"
                if peak == _INF
                else (math.frexp(peak)[1] // 4 if peak else -99)
            )
    return tuple(kind)


def is_random(ir: GraphIR) -> bool:
    """Whether the graph draws random numbers (its values cannot be compared with the reference's), in
    its own ops or in a branch or loop body it calls (``torch.cond``'s subgraphs: a dropout in one branch).
    Read once per graph object and its node count (each check asks; the walk took ~65 us on 8 ops)."""
    key = len(ir.graph.nodes)
    known = _RANDOM.get(ir)
    if known is None or known[0] != key:
        graphs = [ir.gm] + [m for m in ir.gm.modules() if isinstance(m, torch.fx.GraphModule) and m is not ir.gm]
        nodes = [n for g in graphs for n in g.graph.nodes if n.op == "call_function"]
        known = _RANDOM[ir] = (key, any(any(w in op_name(n).lower() for w in _RNG_WORDS) for n in nodes))
    return known[1]


_RANDOM: weakref.WeakKeyDictionary[GraphIR, tuple[int, bool]] = weakref.WeakKeyDictionary()


def compare(ir: GraphIR, out: Sequence[Any], ref: Sequence[Any]) -> str | None:
    """None if ``out`` is an acceptable answer where ``ref`` is the reference's."""
    if not is_random(ir):
        return mismatch(out, ref)
    out, ref = list(out), list(ref)  # random: compared shapes, dtypes and finiteness
    if len(out) != len(ref):
        return f"returned {len(out)} outputs, expected {len(ref)}"
    for i, (o, r) in enumerate(zip(out, ref)):
        if isinstance(r, torch.Tensor):
            if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
                return f"output {i}: {_spec(o)} != expected {_spec(r)} (random graph: shapes compared)"
            if o.dtype.is_floating_point and bool(torch.isfinite(r).all()) and not bool(torch.isfinite(o).all()):
                return f"output {i}: non-finite values where the reference has none (random graph)"
    return None


def _spec(t: Any) -> str:
    return f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _storages(values: Sequence[Any]) -> list[int]:
    return [v.untyped_storage().data_ptr() if isinstance(v, torch.Tensor) and v.numel() else -1 for v in values]


def clone_inputs(args: Sequence[Any], kinds: Sequence[str]) -> list[Any]:
    """Copies of the user inputs (parameters and buffers are shared: trials never write to them)."""
    return [a.clone() if isinstance(a, torch.Tensor) and k == "input" else a for a, k in zip(args, kinds)]


def check_call(
    ir: GraphIR,
    fn: Callable[..., Sequence[Any]],
    args: Sequence[Any],
    *,
    twice: bool = False,
    reference: Sequence[Any] | None = None,
) -> tuple[list[Any] | None, str | None]:
    """Run ``fn`` on copies of ``args`` and judge it: returns (its outputs, None) or (None, the reason).

    ``twice``: call it a second time on other copies and fail it if the first outputs changed or share
    a buffer with the second (a backend that reuses its output buffers), or if the second answer is
    wrong ("wrong answer on its second call": a backend that caches, or turns wrong once warm, is caught
    in the trial under auto, not only when auto picks it; testing/kit.py files it as ``second_call``).
    Exceptions from ``fn`` propagate (the caller names them "crashed").
    """
    kinds = ir.input_kinds
    mine = clone_inputs(args, kinds)  # the backend's: ``args`` (the user's) are the "before" it is held to
    ref_args = clone_inputs(args, kinds)
    given = reference is not None  # computed by the caller on other copies: its buffers say nothing here
    out: list[Any] | None = None
    if not given and _all_copied(args, kinds):
        # Nothing the two runs share (every tensor is a copy): the backend goes first, on caches its
        # last call left warm, and the reference second. The other order ran both cold where the
        # backend's own copy of the weights (ONNX Runtime's packed ones) and the reference's do not
        # fit the caches together: on the zoo's MLP a check cost ~0.5 ms (a warm backend call) more.
        out = list(fn(*mine))
    if reference is None:
        with one_torch_thread():
            result = ir.gm(*ref_args)  # the reference's ops, at the speed of fx's generated code
        reference = list(result) if isinstance(result, (tuple, list)) else [result]
    ref = list(reference)
    if out is None:
        # Parameters and buffers are shared, not copied: the reference reads them before the backend
        # runs, so a backend that writes into them is judged against the values it was given.
        out = list(fn(*mine))
    wrong = compare(ir, out, ref)
    if wrong:
        return None, f"wrong answer: {wrong}"
    ref_ins = [s for s, k in zip(_storages(ref_args), kinds) if k == "input" and s != -1]
    ref_outs = _storages(ref)
    passed_through = _input_aliases(ir) if given else set()
    fault = _input_fault(kinds, mine, args, out, lambda i: ref_outs[i] in ref_ins or i in passed_through)
    if fault:
        return None, fault
    if twice:
        kept = [o.clone() if isinstance(o, torch.Tensor) else o for o in out]
        again = list(fn(*clone_inputs(args, kinds)))
        weights = _weight_outputs(ir)  # the same buffer each call, rightly
        mine_out = {p for i, p in enumerate(_storages(out)) if i not in weights}
        shared = mine_out & set(_storages(again)) - {-1} - set(_storages(args))
        if shared or any(isinstance(o, torch.Tensor) and not _same(o, k) for o, k in zip(out, kept)):
            return None, "overwrites the outputs it returned earlier with a later call's (reused output buffers)"
        wrong = compare(ir, again, ref)
        if wrong:
            return None, f"wrong answer on its second call: {wrong}"
    return out, None


def _input_fault(
    kinds: Sequence[str], mine: Sequence[Any], args: Sequence[Any], out: Sequence[Any], passes: Callable[[int], bool]
) -> str | None:
    """Whether a backend given ``mine`` (copies of ``args``) changed one of them, or returned an output
    sharing memory with one where the graph's output is not that input (``passes(i)`` says it is)."""
    for i, (a, b, k) in enumerate(zip(mine, args, kinds)):
        if k == "input" and isinstance(a, torch.Tensor) and not _same(a, b):
            return f"changed its input {i}, which the graph does not mutate"
    ins = {s for s, k in zip(_storages(mine), kinds) if k == "input" and s != -1}
    for i, s in enumerate(_storages(out)):
        if s != -1 and s in ins and not passes(i):
            return f"returned output {i} sharing memory with an input (the graph's output is a new tensor)"
    return None


def _all_copied(args: Sequence[Any], kinds: Sequence[str]) -> bool:
    """Whether :func:`clone_inputs` copies every tensor of ``args`` (none is a shared parameter or buffer)."""
    return all(k == "input" or not isinstance(a, torch.Tensor) for a, k in zip(args, kinds))


def _input_aliases(ir: GraphIR) -> set[int]:
    """The outputs that are an input or a view of one in the graph itself (a training forward graph
    returns inputs it saves for backward): returning the input's buffer there is the right answer."""
    return {i for i, node in enumerate(ir.outputs) if getattr(viewed(node), "op", None) == "placeholder"}


def _weight_outputs(ir: GraphIR) -> set[int]:
    """The outputs that are a weight or a view of one (``return self.centroid``: a frozen graph's
    constant, or a parameter or buffer placeholder): every call returns the same buffer, rightly."""
    kinds = dict(zip(ir.placeholders, ir.input_kinds))
    out = set()
    for i, node in enumerate(ir.outputs):
        root = viewed(node)
        if isinstance(root, torch.fx.Node) and (root.op == "get_attr" or kinds.get(root, "input") != "input"):
            out.add(i)
    return out


# ------------------------------------------------------------------------------------------- checks beside the call
#: the CPUs this process may run on: a check beside the user's call needs a second one
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def can_check_beside(ir: GraphIR) -> bool:
    """Whether ``ir``'s scheduled checks may run beside the user's calls (the module docstring): a CPU
    graph whose every input is the user's (a frozen inference graph: what the reference reads after the
    call returns is copies, never a parameter or buffer the user's next call may change)."""
    specs = [*ir.input_specs, *ir.output_specs]
    return all(k == "input" for k in ir.input_kinds) and all(s is None or s.device == "cpu" for s in specs)


def beside_now() -> bool:
    """Whether a check may run beside the call now: torch runs its CPU ops on one thread (the worker runs
    on one too: it never adds a pool of threads) and this process may use another CPU."""
    return _CPUS > 1 and torch.get_num_threads() == 1


def check_beside(
    ir: GraphIR, fn: Callable[..., Sequence[Any]], args: Sequence[Any], verdict: Callable[[str | None, float], None]
) -> tuple[list[Any], str | None]:
    """Run ``fn`` on copies of ``args`` and return (its outputs, None) at once, or (its outputs, the
    reason) where it changed its copies of the inputs or returned one of them (judged here: cheap, and
    the user may write into what they get). The answer itself is judged on the checks' worker thread,
    against the reference run on another copy: ``verdict(None or "wrong answer: ...", seconds)`` is
    called there when it is known, ``seconds`` the check's whole cost (the call and copies here, the
    worker's CPU time there). A reference that raises judges nothing (the user's program raises in eager
    as well: not the backend's fault)."""
    t0 = perf_counter()
    kinds = ir.input_kinds
    before = clone_inputs(args, kinds)  # the reference's: nothing touches them until the worker has run it
    mine = clone_inputs(args, kinds)
    out = list(fn(*mine))
    passed_through = _input_aliases(ir)
    fault = _input_fault(kinds, mine, args, out, passed_through.__contains__)
    if fault is None:
        kept = [o.clone() if isinstance(o, torch.Tensor) else o for o in out]  # the user may write into ``out``
        _submit(functools.partial(_judge, ir, kept, before, verdict, perf_counter() - t0))
    return out, fault


def _judge(
    ir: GraphIR, out: list[Any], args: list[Any], verdict: Callable[[str | None, float], None], spent: float
) -> None:
    t0 = thread_time()
    reason = None
    try:
        with torch.no_grad():
            result = ir.gm(*args)
        wrong = compare(ir, out, list(result) if isinstance(result, (tuple, list)) else [result])
        reason = f"wrong answer: {wrong}" if wrong else None
    except Exception:  # noqa: BLE001 -- eager itself raised on these inputs: nothing to judge the backend by
        pass
    verdict(reason, spent + thread_time() - t0)


_WORKER: tuple[int, queue.SimpleQueue[Any], threading.Thread] | None = None
_WORKER_LOCK = threading.Lock()


def _submit(job: Callable[[], None]) -> None:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None or _WORKER[0] != os.getpid():  # none yet, or a forked child (no thread came along)
            jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            worker = threading.Thread(target=_work, args=(jobs,), name="torchmux-checks", daemon=True)
            worker.start()
            if _WORKER is None:
                atexit.register(settle_checks)
            _WORKER = (os.getpid(), jobs, worker)
        _WORKER[1].put(job)


def _work(jobs: queue.SimpleQueue[Any]) -> None:
    torch.set_num_threads(1)  # started only while torch runs on one thread: this thread's ops run alone too
    while True:
        job = jobs.get()
        try:
            job()
        except Exception:  # noqa: BLE001 -- a verdict's bookkeeping never stops the worker
            pass


def settle_checks(timeout: float = 30.0) -> bool:
    """Wait until every check submitted beside a call so far has its verdict (True), at most ``timeout``
    seconds. At exit, before Python stops its threads mid-op, and for tests."""
    with _WORKER_LOCK:
        found = _WORKER
    if found is None or found[0] != os.getpid() or not found[2].is_alive():
        return True
    done = threading.Event()
    found[1].put(done.set)
    return done.wait(timeout)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch's CPU ops on the calling thread alone, for a check inside the user's call.

    With two or more threads, torch's OpenMP regions wait at a barrier for every thread, and its idle
    workers spin for milliseconds after each: on a busy machine a check of the zoo's ViT at 2 threads
    took 40-100 ms against ~3 ms for the call it checks (its ONNX Runtime session, whose pool does not
    wait that way), and the spinning workers took the cores from the calls after it. One thread
    costs at most the parallel speed-up on a rare call (verify's schedule) and leaves nothing spinning."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and bool(
            torch.equal(a, b)
            or (
                a.dtype.is_floating_point
                and torch.equal(torch.isnan(a), torch.isnan(b))
                and torch.equal(a.nan_to_num(), b.nan_to_num())
            )
        )
    )


# ------------------------------------------------------------------------------------------- demotions on disk
def _demotion_path(ir: GraphIR, signature: tuple, backend: Any) -> Any:
    from ..core.version import __version__

    key = "|".join([ir.fingerprint(), repr(signature), backend.name, _version(backend), torch.__version__, __version__])
    return settings.CACHE_DIR.get() / "demoted" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _version(backend: Any) -> str:
    try:
        return str(backend.version)
    except Exception:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
        return "?"


def remember_demotion(ir: GraphIR, signature: tuple, backend: Any, reason: str) -> None:
    """Record on disk that ``backend`` failed a later check on this graph: no process chooses it again
    for this graph and signature until its version (or torch's, or torchmux's) changes, or the record
    is deleted (``torchmux cache demotions --clear [--backend NAME]``, or ``torchmux cache clear``)."""
    try:
        record = {"backend": backend.name, "version": _version(backend), "graph": ir.name, "reason": reason}
        atomic_write(_demotion_path(ir, signature, backend), json.dumps(record))
    except OSError:
        pass  # a read-only cache never stops a call


def demoted(ir: GraphIR, signature: tuple, backend: Any) -> str | None:
    """Why ``backend`` was demoted for this graph and signature, or None."""
    try:
        record = json.loads(_demotion_path(ir, signature, backend).read_text())
    except (OSError, ValueError):
        return None
    reason = record.get("reason") if isinstance(record, dict) else None
    return reason if isinstance(reason, str) else "demoted (record unreadable)"
