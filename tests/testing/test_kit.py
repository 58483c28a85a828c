"""The author kit (testing/kit.py) fails a backend for each thing the runtime refuses, in the runtime's
words, and passes a correct one; torchmux.compile refuses the same backends."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchmux
from torchmux import extend
from torchmux.testing import CASES_BY_OP, Case, conformance_tests, run_kit
from torchmux.testing.cases import Arg
from torchmux.testing.kit import Item, plan

ADD = CASES_BY_OP["aten.add.Tensor"]


class _Base(extend.Backend):
    contract_version = extend.CONTRACT_VERSION
    dtypes = (torch.float32,)
    ops = frozenset({"aten.add.Tensor"})
    auto = False

    def __init__(self, name: str) -> None:
        self.name = name

    def answer(self, args, out, call):
        return out

    def compile(self, request):
        forward = request.ir.gm.forward
        state = {"calls": 0}

        def run(*args):
            state["calls"] += 1
            return self.answer(args, list(forward(*args)), state["calls"])

        return run


class Writes(_Base):  # the case: writes into its input
    def answer(self, args, out, call):
        args[0].add_(1.0)
        return out


class Aliases(_Base):  # x.clone() answered with x itself: right values, the input's buffer
    ops = frozenset({"aten.clone.default"})
    case = Case("aten.clone.default", lambda x: x.clone(), (Arg((4, 8)),), "view")

    def answer(self, args, out, call):
        return [args[0]]


class Reuses(_Base):  # one output buffer for every call
    buffer = None

    def answer(self, args, out, call):
        if self.buffer is None or self.buffer.shape != out[0].shape:
            self.buffer = torch.empty_like(out[0])
        return [self.buffer.copy_(out[0])]


class TurnsWrong(_Base):  # right on its first calls, wrong from its call number ``from_call``
    from_call = 3

    def answer(self, args, out, call):
        return [o + 1 if call >= self.from_call else o for o in out]


class NanBlind(_Base):  # right on finite values, turns NaN into zero
    def answer(self, args, out, call):
        return [torch.nan_to_num(o, nan=0.0) for o in out]


def _op(backend) -> dict[str, str]:
    case = getattr(backend, "case", ADD)
    results = Item("op", case, torch.float32).run(backend) + Item("nonfinite", case, torch.float32).run(backend)
    return {r.check: r.status for r in results}


@pytest.mark.parametrize(
    "backend,failed",
    [
        (_Base("kit_right"), None),
        (Writes("kit_writes"), "inputs"),
        (Aliases("kit_aliases"), "aliasing"),
        (Reuses("kit_reuses"), "fresh"),
        (TurnsWrong("kit_turns_wrong"), "second_call"),
        (NanBlind("kit_nan_blind"), "nonfinite"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "name", None),
)
def test_the_kit_fails_each_fault_in_its_own_check(backend, failed) -> None:
    statuses = _op(backend)
    assert [c for c, s in statuses.items() if s == "fail"] == ([failed] if failed else []), statuses
    order = ["values", "inputs", "aliasing", "fresh", "second_call"]
    if failed in order:  # the checks before it passed, the ones after it were not reached
        at = order.index(failed)
        assert all(statuses[c] == "pass" for c in order[:at]) and all(statuses[c] == "skip" for c in order[at + 1 :])


def test_compile_refuses_what_the_kit_fails() -> None:
    """The kit's ``inputs`` failure is the runtime's: torchmux.compile runs the same backend on eager."""
    backend = Writes("kit_writes_compiled")
    torchmux.register_plugin(backend)
    x, y = torch.randn(4, 8), torch.randn(8)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="changed its input 0"):
        out = torchmux.compile(lambda a, b: a + b, backend=backend.name, options={"isolate": "off"})(x, y)
    torch.testing.assert_close(out, x + y)


def test_the_model_check_sees_weights_and_regions() -> None:
    """A backend that claims the model's matmuls gets frozen weights as get_attr in a region; one that
    reads only placeholders (the docs before issue 27) fails the model check and passes the op checks."""

    class PlaceholdersOnly(_Base):
        ops = frozenset({"aten.addmm.default", "aten.permute.default", "aten.relu.default"})

        def compile(self, request):
            if any(n.op == "get_attr" for n in request.ir.graph.nodes):
                raise NotImplementedError("expected every weight as a placeholder")
            return super().compile(request)

    results = run_kit(PlaceholdersOnly("kit_placeholders_only"), checks=("op", "model"))
    model = [r for r in results if r.check == "model"]
    assert [r.status for r in model] == ["fail", "pass"], model  # inference (frozen) fails, training passes
    assert "expected every weight as a placeholder" in model[0].detail
    assert {r.status for r in results if r.check != "model"} <= {"pass", "skip"}


def test_conformance_tests_is_a_parametrized_pytest_function() -> None:
    test = conformance_tests(_Base("kit_pytest"), checks=("op",))
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    assert [p.id for p in mark.args[1]] == ["kit_pytest-op-add.Tensor-float32"]
    test(plan(_Base("kit_pytest"), checks=("op",))[0])  # runs (and passes) outside a collection too


def test_an_unavailable_backend_gives_one_skipped_test() -> None:
    class Missing(_Base):
        def availability(self):
            return extend.Availability.no("libfoo is not installed: pip install foo")

    test = conformance_tests(Missing("kit_missing"))
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
    (param,) = mark.args[1]
    assert param.marks[0].kwargs["reason"] == "libfoo is not installed: pip install foo"


def test_the_sparse_schedule_catches_a_backend_that_turns_wrong_at_the_next_power_of_two() -> None:
    """The guarantee README and plugins.md state, measured: a backend right on its two trial calls and
    the user's calls 1-4, wrong from the user's call 5, is caught on call 8 under verify="sparse" (calls
    1, 8, 16, ... are checked): calls 5, 6 and 7 returned wrong answers. Under verify="always" call 5
    is checked, caught and answered right. At two torch threads, where every check answers its call (at
    one, a scheduled check runs beside the call: tests/autotune/test_faults.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = _sparse_and_always()
    finally:
        torch.set_num_threads(threads)
    assert results == {"sparse": ([5, 6, 7], 8), "always": ([], 5)}, results


def _sparse_and_always() -> dict[str, tuple[list[int], int | None]]:
    results = {}
    for policy in ("sparse", "always"):
        backend = TurnsWrong(f"kit_sparse_{policy}")
        backend.from_call = 2 + 5  # the trial makes the backend's calls 1-2: the user's call N is its N + 2
        torchmux.register_plugin(backend)
        torch._dynamo.reset()
        f = torchmux.compile(lambda a, b: a + b, backend=backend.name, options={"isolate": "off", "verify": policy})
        x, y = torch.randn(4, 8), torch.randn(8)
        wrong, caught = [], None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for call in range(1, 11):
                if not torch.allclose(f(x, y), x + y):
                    wrong.append(call)
                if caught is None and any("demoted" in str(w.message) for w in seen):
                    caught = call
        results[policy] = (wrong, caught)
    return results
