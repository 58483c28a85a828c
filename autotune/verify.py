"""Verification that lasts: when a chosen backend's answer is checked again, and what a check looks at.

**The checking policy** (``options={"verify": ...}``), per graph and input signature:

- ``"off"`` (or ``False``): a named backend is trusted from its first call (auto still checks each
  candidate once while it measures them: a wrong candidate cannot win).
- ``"first"``: the first call is checked, later calls are trusted (torchmux before 0.x did this).
- ``"sparse"`` (the default; ``True`` means it): the first call, then calls 2, 4, 8, ... 8192, then
  every 8192nd call, and any call whose inputs are *of a new kind*: a user input holds NaN or ±inf for
  the first time, or its largest magnitude falls in a power-of-16 band not seen before (a backend may
  be right on N(0, 1) values and wrong on 1e6). Telling the kind costs one reduction per floating user
  input per call (``torch.aminmax(x)``: the smallest and largest value in one pass, NaN if any value is
  NaN; two numbers to read back); inputs that cannot hold floats and parameters are not scanned.
  A graph holding an op its backend's claims list as ``nonfinite_unsafe`` (the conformance suite's
  NaN/±inf variants differ from eager, e.g. TVM's relu, ORT's amax) is checked on *every* call whose
  inputs hold NaN or ±inf, not only the first such call.
- ``"always"``: every call (for debugging a backend).

**What a check costs, and the budget** (the sparse policy's bound at every point of a run, not only in
the steady state). A check is one run of the graph's own ATen code on one thread (an eager call), a copy
of the user inputs, and the comparison (core/compare.py: a few passes in the outputs' precision; it was
45 ms, six eager calls of the bench's pointwise chain, in float64 with masks, before). Measured on the
pointwise chain (256x1024, one thread, ONNX Runtime chosen): 0.5-1.5 eager calls beyond the call it
answers. On top, :data:`CHECK_BUDGET`: a scheduled check after call 2 is taken only
once the checks so far, that one included, cost at most 10% of the time the graph's calls took (each
unchecked call after a check is timed, what a check cost beyond its call is summed); until then it is
postponed, never dropped. Calls 1, 2, 4 and 8 (:data:`BUDGET_AFTER`), a new kind of input and the
``nonfinite_unsafe`` rule are never postponed. So past call 8 the checks add at most 10% to the
graph's calls' time, besides those four checks (about one eager call each).

**What is caught, and when** (sparse). A backend whose answers go wrong from call k on, on inputs of a
kind already seen, is caught at the first check at or after call k (the trial's two checked calls come before call 1):
for k <= 8 at the next of calls 1, 2, 4, 8; later at the next call of the schedule (at most 2k up to
8192, then within 8192 calls) unless the budget postponed it, to no later than the call where the checks
so far fit in 10% of the time. A check costing c calls is postponed to about call 10 * (checks so far
+ 1) * c at most, and the schedule's doubling outgrows that after a few checks: with c = 2, checks fall
at 1, 2, 4, 8, ~100, 128, 256, 512, ... Inputs of a new kind
(the first NaN, the first inf, a new magnitude band) are checked on their first call whatever the
budget. Every wrong answer caught is answered by the reference; the ones returned before it are not.

**A check** runs the graph's own ATen code (the reference interpreter's ops, without its per-node
bookkeeping) on a copy of the inputs and compares (core/compare.py);
it also fails a candidate that changed a user input the graph does not mutate, returned an output
sharing storage with an input where the reference's output does not, or (first check only: it calls
twice) hands back a buffer a later call overwrites. A graph with random ops (dropout, rand, bernoulli)
is compared as random: shapes, dtypes and finiteness, never values (the generators differ).

**On a mismatch or an exception**: the backend is demoted for this graph and signature (remembered on
disk, see :func:`remember_demotion`), the call is answered by the reference (mismatch) or by the next
correct candidate (exception; eager at worst), and one :class:`TorchmuxFallbackWarning` names the
backend, the graph and the reason.

**Hangs**: the first two checked calls (and the compile) of every candidate run under the trial
deadline (tuner.py ``within_deadline``, isolate.py); a later check runs inside the user's own call
(guard.py) and has no deadline: a backend that hangs there hangs that call.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..core import settings
from ..core.artifacts import atomic_write
from ..core.compare import mismatch
from ..core.ir import GraphIR, op_name

POLICIES = ("off", "first", "sparse", "always")
SPARSE_UNTIL = 8192  # calls 2, 4, ..., 8192 are checked; after that every SPARSE_EVERY-th
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
    """Whether call number ``call`` (1-based) is on the sparse schedule."""
    if call <= SPARSE_UNTIL:
        return call & (call - 1) == 0  # 1, 2, 4, 8, ...
    return call % SPARSE_EVERY == 0


#: the most of a graph's time its scheduled checks may take (see the module docstring): a scheduled check
#: past call BUDGET_AFTER waits until the checks so far, itself included, cost at most this share of the
#: calls' time
CHECK_BUDGET = 0.1
#: calls 1, 2, 4 and 8 are checked whatever they cost: a backend that turns wrong just after its trial is
#: caught by call 8, as the schedule promises (plugins.md, tests/testing/test_kit.py)
BUDGET_AFTER = 8


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
    if call < SPARSE_UNTIL:
        return 1 << call.bit_length()  # the next power of two
    return (call // SPARSE_EVERY + 1) * SPARSE_EVERY


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
    """Whether the graph draws random numbers (its values cannot be compared with the reference's)."""
    return any(any(w in op_name(n).lower() for w in _RNG_WORDS) for n in ir.op_nodes)


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
    a buffer with the second (a backend that reuses its output buffers).
    Exceptions from ``fn`` propagate (the caller names them "crashed").
    """
    kinds = ir.input_kinds
    mine = clone_inputs(args, kinds)  # the backend's: ``args`` (the user's) are the "before" it is held to
    ref_args = clone_inputs(args, kinds)
    if reference is None:
        with one_torch_thread():
            result = ir.gm(*ref_args)  # the reference's ops, at the speed of fx's generated code
        reference = list(result) if isinstance(result, (tuple, list)) else [result]
    given = reference is not None  # computed by the caller on other copies: its buffers say nothing here
    ref = list(reference)
    out = list(fn(*mine))
    wrong = compare(ir, out, ref)
    if wrong:
        return None, f"wrong answer: {wrong}"
    for i, (a, b, k) in enumerate(zip(mine, args, kinds)):
        if k == "input" and isinstance(a, torch.Tensor) and not _same(a, b):
            return None, f"changed its input {i}, which the graph does not mutate"
    ins = [s for s, k in zip(_storages(mine), kinds) if k == "input" and s != -1]
    ref_ins = [s for s, k in zip(_storages(ref_args), kinds) if k == "input" and s != -1]
    passed_through = _input_aliases(ir) if given else set()
    for i, (s, rs) in enumerate(zip(_storages(out), _storages(ref))):
        if s != -1 and s in ins and rs not in ref_ins and i not in passed_through:
            return None, f"returned output {i} sharing memory with an input (the graph's output is a new tensor)"
    if twice:
        kept = [o.clone() if isinstance(o, torch.Tensor) else o for o in out]
        again = list(fn(*clone_inputs(args, kinds)))
        shared = set(_storages(out)) & set(_storages(again)) - {-1} - set(_storages(args))
        if shared or any(isinstance(o, torch.Tensor) and not _same(o, k) for o, k in zip(out, kept)):
            return None, "overwrites the outputs it returned earlier with a later call's (reused output buffers)"
    return out, None


def _input_aliases(ir: GraphIR) -> set[int]:
    """The outputs that are an input or a view of one in the graph itself (a training forward graph
    returns inputs it saves for backward): returning the input's buffer there is the right answer."""
    out: set[int] = set()
    for i, node in enumerate(ir.outputs):
        while isinstance(node, torch.fx.Node) and node.op == "call_function":
            schema = getattr(node.target, "_schema", None)
            returns = schema.returns if schema is not None else ()
            if not (returns and returns[0].alias_info is not None and node.args):
                break
            node = node.args[0]  # a view: follow it to what it views
        if isinstance(node, torch.fx.Node) and node.op == "placeholder":
            out.add(i)
    return out


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
