"""api/compile.py: compile() on real models with eager, inductor and auto; arguments; fallbacks."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchmux
from torchmux.bench.zoo import build, tensors_of
from torchmux.core.registry import get_registry


def _check(model, args, backend):
    with torch.no_grad():
        expected = tensors_of(model(*args))
        got = tensors_of(torchmux.compile(model, backend=backend)(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


MODELS = ["mlp", "resnet", "bert"]


@pytest.mark.parametrize("name", MODELS)
def test_eager_backend_matches_eager(name):
    model, args = build(name, 2)
    _check(model, args, "eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", ["inductor", "auto"])
def test_inductor_and_auto_match_eager(name, backend):
    model, args = build(name, 2)
    _check(model, args, backend if backend == "inductor" else ["eager", "inductor"])


def test_auto_measures_candidates_and_picks_a_correct_one():
    model, (x,) = build("mlp", 4)
    report = torchmux.explain(model, x, backend="auto")
    assert report.graph_count == 1
    placement = report.graphs[0].placements[0]
    assert any(name in placement for name in [r.name for r in torchmux.list_backends() if r.available])


def test_explain_captures_without_placing_unless_a_backend_is_named():
    """explain's default only captures: no backend is compiled or measured (it costs what
    torch._dynamo.explain costs); backend= places."""
    measured = []

    class Spy:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):
            measured.append(backend)

    model, (x,) = build("mlp", 2)
    spy = Spy()
    torchmux.register_plugin(spy, name="explain-spy")
    try:
        report = torchmux.explain(model, x)
        assert report.graph_count == 1 and report.graphs[0].aten_ops > 0
        assert report.graphs[0].placements == [] and measured == []
    finally:
        from torchmux.core.registry import get_registry

        get_registry().pm.unregister(spy)


def test_the_measured_hook_flags_the_candidate_that_runs_the_graph():
    """``chosen`` names the candidate the tuner picked, the one explain reports and the calls run:
    not always the fastest median (a tie within 3% goes by other rules), so observers need the flag."""
    measured = []

    class Spy:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, ok, chosen):
            measured.append((ir.name, backend, ok, chosen))

    model, (x,) = build("mlp", 2)
    spy = Spy()
    torchmux.register_plugin(spy, name="chosen-spy")
    try:
        report = torchmux.explain(model, x, backend=["eager", "onnxruntime"])
    finally:
        from torchmux.core.registry import get_registry

        get_registry().pm.unregister(spy)
    chosen = [(graph, backend) for graph, backend, ok, flag in measured if flag]
    assert len(chosen) == 1 and {b for _, b, _, _ in measured} == {"eager", "onnxruntime"}
    assert chosen[0][1] in report.graphs[0].placements[0]


def test_torch_compile_reaches_torchmux_through_its_entry_point():
    model, (x,) = build("mlp", 2)
    with torch.no_grad():
        out = torch.compile(model, backend="torchmux", options={"backend": "eager"})(x)
        torch.testing.assert_close(out, model(x))


def test_decorator_forms():
    @torchmux.compile
    def f(x):
        return torch.sin(x) * 2

    @torchmux.compile(backend="eager")
    def g(x):
        return torch.cos(x) + 1

    x = torch.randn(5)
    torch.testing.assert_close(f(x), torch.sin(x) * 2)
    torch.testing.assert_close(g(x), torch.cos(x) + 1)


def test_disable_returns_the_model_itself():
    model = torch.nn.Linear(2, 2)
    assert torchmux.compile(model, disable=True) is model


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "fastest"}, "mode='fastest' is not a mode"),
        ({"backend": 3}, "backend=3 is not accepted"),
        ({"options": {"bogus": 1}}, "options\\['bogus'\\] is not a known option"),
        ({"options": {"verify": "yes"}}, "options\\['verify'\\] must be bool"),
        ({"dynamic": "maybe"}, "dynamic must be None, True or False"),
        ({"fullgraph": 1}, "fullgraph must be True or False"),
    ],
)
def test_bad_arguments_say_what_is_accepted(kwargs, match):
    with pytest.raises(torchmux.BadArgumentError, match=match):
        torchmux.compile(torch.nn.Linear(2, 2), **kwargs)


def test_not_callable_is_refused():
    with pytest.raises(torchmux.BadArgumentError, match="nn.Module or a function"):
        torchmux.compile(42)


# ---- a backend that fails never takes the program down and never returns a wrong result ----------


class _Faulty(torchmux.Backend):
    devices = ("cpu",)

    def __init__(self, name, fault):
        self.name, self.fault = name, fault

    def compile(self, request):
        if self.fault == "compile":
            raise RuntimeError("this backend cannot compile anything")
        forward = request.ir.gm.forward

        def run(*args):
            if self.fault == "crash":
                raise RuntimeError("segfault-like crash at run time")
            return [t + 1 for t in forward(*args)]  # fault == "wrong": off by one

        return run


class _FaultyPlugin:
    @torchmux.hookimpl
    def torchmux_add_backends(self):
        return [
            _Faulty("faulty_compile", "compile"),
            _Faulty("faulty_crash", "crash"),
            _Faulty("faulty_wrong", "wrong"),
        ]


@pytest.fixture(scope="module")
def faulty():
    registry = get_registry()
    if "faulty_wrong" not in registry.names:
        registry.register(_FaultyPlugin(), "faulty")
    return registry


@pytest.mark.parametrize(
    "name,reason",
    [
        ("faulty_compile", "compile failed"),
        ("faulty_crash", "crashed"),
        ("faulty_wrong", "wrong answer"),
    ],
)
def test_named_backend_failure_falls_back_and_says_so(faulty, name, reason):
    f = lambda x: torch.tanh(x) * 3  # noqa: E731
    x = torch.randn(4, 4)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match=f"{name} {reason}.*Running it on eager"):
        out = torchmux.compile(f, backend=name)(x)
    torch.testing.assert_close(out, f(x))


def test_auto_never_picks_a_wrong_backend(faulty):
    f = lambda x: torch.exp(x) - 1  # noqa: E731
    x = torch.randn(64, 64)
    report = torchmux.explain(f, x, backend=["faulty_wrong", "faulty_crash", "eager"])
    assert report.graphs[0].placements == [report.graphs[0].placements[0]]
    assert "eager" in report.graphs[0].placements[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)  # auto falls back silently
        torch.testing.assert_close(torchmux.compile(f, backend=["faulty_wrong", "eager"])(x), f(x))


def test_explain_reports_a_latency_only_for_candidates_timed_against_each_other(faulty):
    """A named backend is checked, not timed: explain shows no milliseconds for it (its first checked
    calls, the reference's run and the comparison included, are no latency); candidates that raced
    (a list is auto among them, eager included) show their median."""
    x = torch.randn(64, 64)
    (alone,) = torchmux.explain(lambda x: torch.exp(x) - 2, x, backend="inductor").graphs[0].placements
    assert alone == "inference: inductor", alone
    report = torchmux.explain(lambda x: torch.exp(x) - 3, x, backend=["faulty_crash", "inductor"])
    (raced,) = report.graphs[0].placements
    assert raced.endswith(" ms"), raced
