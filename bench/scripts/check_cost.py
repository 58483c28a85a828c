"""What checking costs a user's early calls: auto's mean call over its first 10, 100 and 1,000 calls
against its steady state, per bench zoo model (issue 29's bound: within 10% over the first 100 calls,
within 3% over the first 1,000, a single check at most about two eager calls of its graph).

    python -m torchmux.bench.scripts.check_cost [--models mlp,pointwise,resnet,attention,bert]
        [--batch-size 1] [--rounds 5] [--calls 1000] [--clock thread|wall]

One torch thread, eval, ``torch.no_grad()``. Each model is compiled once with ``backend="auto"`` and
called once (that call compiles, tunes and makes the schedule's call 1: it is not counted). Then, in each
of ``--rounds`` rounds, two states of the model's Guards (autotune/guard.py: the verify policy; their
verify.Schedule) take turns call by call (fresh, steady, steady, fresh, ...: the machine's noise, and
what one call leaves in the caches for the next, hit both alike):

- *fresh*: the state every Guard had right after that first call: the user's calls 2, 3, ..., with
  the schedule's checks (and the budget's postponements) where a user would meet them;
- *steady*: the Guards far into a run (call 100,000, between the sparse schedule's checks, every kind
  of input seen): what a call costs once checks are rare.

Both go through the whole compiled model (Dynamo, the frozen weights' check, the Guard, the backend).
Each call is timed in CPU time of the calling thread (time.thread_time: every backend here runs in the
caller's thread at one thread, and the time other jobs on a shared machine take is left out), or with
``--clock wall`` by the wall clock (what the user waits, a check's worker's contention included). Reported
per model: the backend(s) auto chose, eager's call (the model run eagerly, one thread, in a warm loop),
the steady call, and for the first 10/100/1,000 calls the fresh mean over the steady mean (the median
of the rounds' ratios; the rounds' spread in brackets), the checks made in that window, the user's call
numbers the checks fell on, and what one check cost beyond its call (the checked call less the steady
calls beside it), in eager calls; and that cost in eager calls made beside the backend (each eager call
right after a steady call of the compiled model: the caches as a check's reference finds them, where
a model's weights and the backend's own copy of them do not both fit). That cost is the user's thread's:
at one torch thread on a machine with a second CPU, a scheduled check runs its reference and comparison
on the checks' worker thread (autotune/verify.py, "checks beside the call"), which the user's call does
not wait for; so the last column is each check's whole work (this thread's part and the worker's CPU
time, as the check budget counts it: the mean over the fresh calls' checks after call 1), in eager calls.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
import warnings
from typing import Any

import torch

DEFAULT_MODELS = "mlp,pointwise,resnet,attention,bert"
#: what a call is timed by (``--clock``): this thread's CPU time (the time other jobs take from it is left
#: out), or the wall clock (what the user waits, a check's worker's contention included)
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
WINDOWS = (10, 100, 1000)


def _guards() -> list[Any]:
    from torchmux.autotune.guard import Guard

    found = []
    for o in gc.get_objects():
        try:
            if type(o) is Guard:  # type(), not isinstance(): a dead weak proxy raises on the latter
                found.append(o)
        except ReferenceError:
            pass
    return found


def _copied(v: Any) -> Any:
    from torchmux.autotune.verify import Schedule

    if isinstance(v, Schedule):  # where the guard's checks stand: its own copy, its own set of kinds
        out = copy.copy(v)
        out.kinds = set(v.kinds)
        return out
    return copy.copy(v)


def _snapshot(guards: list[Any]) -> list[dict[str, Any]]:
    """Each guard's state, copied deep enough that running on changes nothing in it."""
    return [{k: _copied(v) for k, v in vars(g).items()} for g in guards]


def _restore(guards: list[Any], states: list[dict[str, Any]]) -> None:
    for g, state in zip(guards, states):
        vars(g).update({k: _copied(v) for k, v in state.items()})


def _far(guards: list[Any], pristine: list[dict[str, Any]], call: int = 100_000) -> list[dict[str, Any]]:
    """The guards' state deep into a run: ``call`` calls made, every kind of input seen, no check due."""
    from torchmux.autotune import verify

    _restore(guards, pristine)
    for g in guards:
        g.s.calls, g.s.next, g._first = call, verify.next_scheduled(call), False
    return _snapshot(guards)


def _checks(guards: list[Any]) -> int:
    return sum(int(getattr(g, "checks", 0)) for g in guards)


def _interleaved(
    fn: Any, args: tuple, calls: int, guards: list[Any], states: dict[str, list[dict[str, Any]]], perf: Any
) -> Any:
    """``calls`` calls of each state, alternating call by call (fresh, steady, steady, fresh, ...): each
    guard is given the state's own dict before the call and leaves its changes there after it."""
    times: dict[str, list[float]] = {k: [] for k in states}
    checked: list[int] = []
    for i in range(calls):
        for which in ("fresh", "steady") if i % 2 == 0 else ("steady", "fresh"):
            mine = states[which]
            for g, state in zip(guards, mine):
                vars(g).update(state)
            before = _checks(guards)
            t0 = perf()
            fn(*args)
            times[which].append(perf() - t0)
            if which == "fresh" and _checks(guards) != before:
                checked.append(i)
            for g, state in zip(guards, mine):
                state.update(vars(g))
    return times["fresh"], times["steady"], checked


def measure(name: str, batch: int, rounds: int, calls: int, clock: str = "thread") -> dict[str, Any]:
    import torchmux
    from torchmux.autotune import verify
    from torchmux.bench import zoo

    perf = CLOCKS[clock]
    model, args = zoo.build(name, batch=batch)
    model.eval()
    with torch.no_grad():
        before = {id(g) for g in _guards()}
        torch._dynamo.reset()
        compiled = torchmux.compile(model, backend="auto")
        compiled(*args)  # compiles, tunes, and is the schedule's call 1
        guards = [g for g in _guards() if id(g) not in before]
        pristine = _snapshot(guards)
        far = _far(guards, pristine)
        for _ in range(20):  # eager warm
            model(*args)
        t0 = perf()
        for _ in range(50):
            model(*args)
        eager = (perf() - t0) / 50
        # eager beside the backend: each eager call after a call of the compiled model (in its steady
        # state), so that the caches hold what the backend left there, as a check's reference finds them
        _restore(guards, far)
        beside = []
        for _ in range(50):
            compiled(*args)
            t0 = perf()
            model(*args)
            beside.append(perf() - t0)
        eager_beside = statistics.median(beside)
        fresh_runs: list[list[float]] = []
        steady_runs: list[list[float]] = []
        checked_at: list[list[int]] = []
        whole: list[float] = []  # each round's checks' whole work (this thread's and the worker's) per check
        for _ in range(rounds):
            states = {"fresh": _snapshot_of(pristine), "steady": _snapshot_of(far)}
            fresh, steady, checked = _interleaved(compiled, args, calls, guards, states, perf)
            verify.settle_checks()
            made = sum(st["s"].checks for st in states["fresh"]) - sum(st["s"].checks for st in pristine)
            if made:
                whole.append(sum(st["s"].spent for st in states["fresh"]) / made)
            fresh_runs.append(fresh)
            steady_runs.append(steady)
            checked_at.append(checked)
        _restore(guards, far)
    steady_mean = statistics.median(statistics.fmean(s) for s in steady_runs)
    result: dict[str, Any] = {
        "model": name,
        "backend": ",".join(sorted({g.backend for g in guards})) or "?",
        "graphs": len(guards),
        "eager_ms": eager * 1e3,
        "steady_ms": steady_mean * 1e3,
        "checks_at": [c + 2 for c in checked_at[0]],  # as the user's call numbers (call 1 compiled)
    }
    for w in WINDOWS:
        if w > calls:
            continue
        ratios = [statistics.fmean(f[:w]) / statistics.fmean(s[:w]) for f, s in zip(fresh_runs, steady_runs)]
        result[f"first{w}"] = (statistics.median(ratios), min(ratios), max(ratios))
        result[f"checks{w}"] = statistics.median(sum(1 for c in ck if c < w) for ck in checked_at)
    # one check's cost beyond its call: the checked call less the steady calls made beside it
    costs = [
        f[c] - statistics.median(s[max(c - 5, 0) : c + 6])
        for f, s, ck in zip(fresh_runs, steady_runs, checked_at)
        for c in ck
    ]
    result["check_eager_calls"] = (statistics.median(costs) / eager, max(costs) / eager) if costs else (0.0, 0.0)
    result["eager_beside_ms"] = eager_beside * 1e3
    result["check_beside_calls"] = statistics.median(costs) / eager_beside if costs else 0.0
    result["check_whole_calls"] = statistics.median(whole) / eager if whole else 0.0
    return result


def _snapshot_of(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: _copied(v) for k, v in state.items()} for state in states]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--models", default=DEFAULT_MODELS, help=f"zoo models, comma-separated, or 'all' (default {DEFAULT_MODELS})"
    )
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--clock", choices=tuple(CLOCKS), default="thread", help="what a call is timed by")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(
        f"one thread, batch {a.batch_size}, {a.rounds} interleaved rounds of {a.calls} calls; "
        "fresh mean / steady mean over the user's calls 2.. (call 1 compiles), median of rounds [min-max]"
    )
    head = "| model | auto's backend | eager ms | steady ms | " + " | ".join(f"first {w}" for w in WINDOWS)
    print(
        head + " | checks in 10/100/1000 | one check, eager calls (median, max) | eager beside the backend ms | "
        "one check, in those | one check's whole work, eager calls |"
    )
    print("|" + "---|" * (len(WINDOWS) + 9))
    from torchmux.bench.zoo import ZOO

    for name in list(ZOO) if a.models == "all" else a.models.split(","):
        r = measure(name, a.batch_size, a.rounds, a.calls, a.clock)
        cells = [
            f"{r[f'first{w}'][0]:.3f} [{r[f'first{w}'][1]:.2f}-{r[f'first{w}'][2]:.2f}]" if f"first{w}" in r else "-"
            for w in WINDOWS
        ]
        counts = "/".join(str(r.get(f"checks{w}", "-")) for w in WINDOWS)
        cost = r["check_eager_calls"]
        print(
            f"| {name} | {r['backend']} | {r['eager_ms']:.3f} | {r['steady_ms']:.3f} | "
            + " | ".join(cells)
            + f" | {counts} | {cost[0]:.2f}, {cost[1]:.2f} | {r['eager_beside_ms']:.3f} | {r['check_beside_calls']:.2f}"
            + f" | {r['check_whole_calls']:.2f} |",
            flush=True,
        )
        print(f"  checks at the user's calls {r['checks_at']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
