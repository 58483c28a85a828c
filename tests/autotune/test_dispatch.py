"""autotune/runner.py, tuner.py, partition.py and cache.py: choosing, partitioning, remembering."""

from __future__ import annotations

import math

import pytest
import torch

import torchmux
from torchmux.autotune.placement import build_placement
from torchmux.autotune.runner import GraphRunner
from torchmux.autotune.tuner import SCREEN_FACTOR, Measurement, choose, measure
from torchmux.core.config import resolve
from torchmux.core.ir import GraphIR
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace


def chain(x, y):
    return (torch.relu(x * y + 1).sum(-1) + 2).tanh()


def args():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)]


class Pointwise(torchmux.Backend):
    """Claims only mul and add: everything else must run eagerly around its region."""

    name = "pointwise_only"
    ops = frozenset({"aten.mul.Tensor", "aten.add.Tensor"})
    calls = 0

    def compile(self, request):
        forward = request.ir.gm.forward
        ops = {torchmux.core.ir.op_name(n) for n in request.ir.op_nodes}
        assert ops <= self.ops, ops  # the partitioner handed over claimed ops only

        def run(*a):
            Pointwise.calls += 1
            return list(forward(*a))

        return run


def test_partition_places_claimed_ops_and_runs_the_rest_eagerly():
    ir = trace(chain, args())
    placement = build_placement(ir, Pointwise(), args(), mode=None, options={})
    assert placement.ops_on_backend == 3  # mul and add, then the add after sum
    assert placement.regions == 2  # relu and sum sit between them
    assert placement.ops_eager == len(ir.op_nodes) - 3
    before = Pointwise.calls
    torch.testing.assert_close(placement.fn(*args())[0], chain(*args()))
    assert Pointwise.calls == before + 2


def test_measure_records_failures_as_infinite_cost():
    class Broken(torchmux.Backend):
        name = "broken"

        def compile(self, request):
            raise ValueError("no kernels for you")

    ir = trace(chain, args())
    results = measure(ir, [get_registry().get("eager"), Broken()], args(), time_budget=0.05)
    broken = next(m for m in results if m.backend == "broken")
    assert broken.seconds == math.inf and not broken.ok and "no kernels for you" in broken.reason
    assert choose(results).backend == "eager"


def test_runner_decides_once_per_signature():
    ir = trace(chain, args())
    runner = GraphRunner(ir, resolve("eager", None, None))
    runner(*args())
    runner(*args())
    assert len(runner.decisions) == 1
    runner(torch.randn(8, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64))
    assert len(runner.decisions) == 2


def test_a_new_runner_remembers_the_winner_from_disk():
    ir = trace(chain, args())
    config = resolve(["eager", "example"] if "example" in get_registry().names else ["eager", "inductor"], None, None)
    first = GraphRunner(ir, config)
    first(*args())
    winner = first.decisions and next(iter(first.decisions.values())).backend
    second = GraphRunner(ir, config)  # as a new process would: same graph, same candidates
    out = second(*args())
    decision = next(iter(second.decisions.values()))
    assert decision.backend == winner
    assert len([m for m in decision.measurements if m.placement is not None]) == 1  # compiled only the winner
    torch.testing.assert_close(out[0], chain(*args()))


def test_a_winner_measured_on_other_threads_is_measured_again():
    """Which backend wins a CPU graph changes with the thread count, so a decision made at one count is
    not taken from disk at another."""
    ir = trace(chain, args())
    config = resolve(["eager", "inductor"], None, None)
    threads = torch.get_num_threads()
    other = 2 if threads == 1 else 1
    try:
        torch.set_num_threads(other)
        GraphRunner(ir, config)(*args())  # decided and remembered at the other count
        torch.set_num_threads(threads)
        again = GraphRunner(ir, config)
        out = again(*args())
        decision = next(iter(again.decisions.values()))
        assert len([m for m in decision.measurements if m.placement is not None]) == 2  # both built and timed
        remembered = GraphRunner(ir, config)  # the same count again: taken from disk, only the winner built
        remembered(*args())
        decision = next(iter(remembered.decisions.values()))
        assert len([m for m in decision.measurements if m.placement is not None]) == 1
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(out[0], chain(*args()))


def test_explicit_backend_is_verified_before_trusted():
    ir = trace(chain, args())
    runner = GraphRunner(ir, resolve("eager", None, None))
    runner(*args())
    assert next(iter(runner.decisions.values())).backend == "eager"


class Slow(torchmux.Backend):
    """Runs the graph correctly, 20 ms late: it cannot win, so the tuner must not spend its budget on it."""

    name = "slow"

    def compile(self, request):
        import time

        forward = request.ir.gm.forward

        def run(*a):
            time.sleep(0.02)
            return list(forward(*a))

        return run


def test_a_candidate_far_slower_than_the_best_is_screened_out_of_the_rounds():
    ir = trace(chain, args())
    eager, inductor = get_registry().get("eager"), get_registry().get("inductor")
    results = {m.backend: m for m in measure(ir, [Slow(), eager, inductor], args(), time_budget=0.2)}
    assert all(m.ok for m in results.values())
    assert len(results["slow"].samples) == 1 and results["slow"].seconds >= 0.02  # its best warm call
    # eager and Inductor are timed in rounds, unless one is itself screened out (a tiny graph's interpreted
    # eager can be 3x Inductor: 95 us against 30); then the other is alone and needs no rounds
    screened = [n for n in ("eager", "inductor") if len(results[n].samples) == 1]
    assert all(
        results[n].seconds > SCREEN_FACTOR * results["inductor" if n == "eager" else "eager"].seconds for n in screened
    )
    if not screened:
        assert len(results["eager"].samples) >= 3 and len(results["inductor"].samples) >= 3
    assert choose(list(results.values())).backend in ("eager", "inductor")


def test_decisions_are_keyed_on_the_users_inputs_not_the_weights():
    def linear(x, w, b):
        return torch.relu(x @ w.t() + b)

    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    ir = GraphIR(trace(linear, [x, w, b]).gm, ["input", "param", "param"], name="linear")
    runner = GraphRunner(ir, resolve("eager", None, None))
    torch.testing.assert_close(runner(x, w, b)[0], linear(x, w, b))
    (sig,) = runner.decisions
    assert sig == ((x.shape, x.dtype, x.device),)  # the weights' specs are the graph's, not the call's


def test_float64_graphs_run_on_eager_and_auto() -> None:
    """Eager runs every op in every dtype; the other backends' claims skip float64 ops, which then run
    eagerly between their regions."""

    def f(x):
        return torch.tanh(x * 3).sum(-1, keepdim=True) + x.double().exp()

    x = torch.randn(4, 8, dtype=torch.float64)
    ir = trace(f, [x])
    for backend in ("eager", "auto"):
        runner = GraphRunner(ir, resolve(backend, None, None))
        torch.testing.assert_close(runner(x)[0], f(x))


def test_a_tie_goes_to_fewer_eager_ops_then_the_steadier_candidate():
    """choose(): medians within TIE of the fastest are a tie; fewer ops left to eager wins it, then the
    smaller spread; outside the tie the faster median wins whatever its eager ops."""
    from torchmux.autotune.placement import Placement
    from torchmux.autotune.tuner import TIE

    def m(name: str, seconds: float, eager_ops: int, samples: list[float]) -> Measurement:
        p = Placement(
            name, lambda *a: a, ops_on_backend=10 - eager_ops, ops_eager=eager_ops, regions=1, compile_seconds=0.0
        )
        return Measurement(name, seconds, True, placement=p, samples=samples)

    steady = [1.0e-3] * 8
    noisy = [0.8e-3, 0.9e-3, 1.0e-3, 1.1e-3, 1.2e-3, 1.3e-3, 0.7e-3, 1.0e-3]
    fast_but_eager = m("a", 1.00e-3, 3, steady)
    slightly_slower_all_on_backend = m("b", 1.00e-3 * (1 + TIE / 2), 0, steady)
    assert choose([fast_but_eager, slightly_slower_all_on_backend]).backend == "b"
    same_eager_noisy = m("c", 0.99e-3, 0, noisy)
    assert choose([same_eager_noisy, slightly_slower_all_on_backend]).backend == "b"  # steadier wins the tie
    clearly_faster = m("d", 1.00e-3 * (1 - 3 * TIE), 5, noisy)
    assert choose([clearly_faster, slightly_slower_all_on_backend, fast_but_eager]).backend == "d"
    assert choose([Measurement("x", math.inf, False, "broke")]) is None


def test_the_tuners_thread_has_its_timing_and_reference_run_in_the_callers_thread():
    """in_own_thread: the work runs in a thread of its own, but time_rounds and the reference run come
    back to the caller's thread (a second thread with an OpenMP team of its own slows every parallel
    op at 2+ threads; tuner.in_own_thread says why), and exceptions reach the caller."""
    import threading

    from torchmux.autotune.tuner import in_own_thread, on_caller, time_rounds

    caller, seen = threading.get_ident(), {"timed": set()}
    x = torch.randn(64)

    def candidate(x):
        seen["timed"].add(threading.get_ident())
        return (x * 2,)

    def work():
        seen["work"] = threading.get_ident()
        seen["reference"] = on_caller(threading.get_ident)
        live = [(Measurement("a", math.inf, True), candidate), (Measurement("b", math.inf, True), candidate)]
        time_rounds(live, [x], 0.01, 3)
        return [m.seconds for m, _ in live]

    seconds = in_own_thread(work, "torchmux-test")
    assert all(math.isfinite(s) and s > 0 for s in seconds)
    assert seen["work"] != caller and seen["reference"] == caller and seen["timed"] == {caller}

    def fails():
        on_caller(lambda: 1 / 0)

    with pytest.raises(ZeroDivisionError):
        in_own_thread(fails, "torchmux-test")
    assert on_caller(threading.get_ident) == caller  # outside the tuner's thread: runs here
