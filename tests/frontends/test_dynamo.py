"""frontends/dynamo.py and api/explain.py: capture, normalization, graph counts, fullgraph errors.

The four programs are those of the "common torch.compile mistakes" article. Capture here is Dynamo's
own (the mending pass is off), so graph and break counts must equal torch._dynamo.explain's.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn

import torchmux


@contextlib.contextmanager
def captured_graphs():
    """Collect every GraphIR the frontend captures inside the block (through the observation hook)."""
    graphs = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_graph_captured(self, ir):
            graphs.append(ir)

    registry = torchmux.core.registry.get_registry()
    registry.pm.register(Observer(), name="test-observer")
    try:
        yield graphs
    finally:
        registry.pm.unregister(name="test-observer")


class BadIf(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.Linear(16, 16)

    def forward(self, x):
        if torch.rand(1) > 0.5:  # Python if on a tensor
            return self.h(x) + 1
        else:
            return self.h(x) - 1


class LogInsideForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.Linear(16, 1)

    def forward(self, x):
        y = self.h(x)
        m = y.mean().item()  # noqa: F841  host sync, graph break
        return y


class BadLoop(nn.Module):
    def forward(self, x):
        out = x
        for i in range(5):
            out = out + i
        return out


class BadShapeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        if x.shape[1] == 16:
            return self.a(x)
        else:
            return self.b(x)


PROGRAMS = {
    "tensor_if": (BadIf, (4, 16)),
    "item_in_forward": (LogInsideForward, (8, 16)),
    "python_loop": (BadLoop, (32, 16)),
    "shape_branch_16": (BadShapeBranch, (8, 16)),
    "shape_branch_32": (BadShapeBranch, (8, 32)),
}


def _dynamo_counts(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = torch._dynamo.explain(model)(x)
    sites = {repr(r.user_stack[-1]) for r in e.break_reasons if r.user_stack}
    return e.graph_count, len(sites)


@pytest.mark.parametrize("name", PROGRAMS)
def test_counts_equal_dynamo_explain_and_outputs_equal_eager(name):
    cls, shape = PROGRAMS[name]
    torch.manual_seed(0)
    model, x = cls().eval(), torch.randn(shape)
    graphs, breaks = _dynamo_counts(model, x)
    report = torchmux.explain(model, x, backend="eager", mend=False)
    assert (report.graph_count, report.graph_break_count) == (graphs, breaks)
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    got = torchmux.compile(model, backend="eager", options={"mend": False})(x)
    torch.testing.assert_close(got, expected)


def test_break_reason_points_at_user_line():
    report = torchmux.explain(LogInsideForward(), torch.randn(8, 16), backend="eager", mend=False)
    assert report.graph_break_count == 1
    reason = report.break_reasons[0]
    assert reason.filename == __file__
    assert "item()" in reason.line
    assert "Graph Break Count: 1" in str(report)


def test_explain_reports_ops_and_backend_per_graph():
    report = torchmux.explain(BadLoop(), torch.randn(32, 16), backend="eager")
    assert report.graph_count == 1
    assert len(report.ops_per_graph[0]) == 5  # five adds at the torch level
    assert report.graphs[0].aten_ops == 5
    assert report.graphs[0].placements[0].endswith("eager")


def test_fullgraph_error_names_reason_and_line():
    compiled = torchmux.compile(BadIf(), backend="eager", fullgraph=True, options={"mend": False})
    with pytest.raises(torchmux.FullGraphError) as info:
        compiled(torch.randn(4, 16))
    message = str(info.value)
    assert f"{__file__}:" in message
    assert "torch.rand(1) > 0.5" in message
    assert "Data-dependent" in message
    assert "fullgraph=False" in message  # says what to do


class LegacyBoxes(nn.Module):
    """Old detection code: ``torch.FloatTensor(shape)`` then filled in place. Eager runs it; Dynamo's fake
    tensors read the legacy constructor's size as data and fail (TorchRuntimeError) while tracing."""

    def forward(self, x):
        boxes = torch.FloatTensor(x[..., :2].shape)
        boxes[..., 0] = x[..., 0] * 2  # the line Dynamo fails on
        boxes[..., 1] = x[..., 1] + 1
        return boxes.relu()


def test_a_frame_dynamo_fails_on_runs_as_python_with_a_warning_and_explain_lists_it():
    model, x = LegacyBoxes(), torch.randn(3, 4, 5)
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):  # torch.compile takes the program down
        torch.compile(model, backend="eager")(x)
    torch._dynamo.reset()
    compiled = torchmux.compile(model, backend="eager")
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="Dynamo failed while capturing forward") as seen:
        out = compiled(x)
    assert torch.equal(out, model(x))
    line = LegacyBoxes.forward.__code__.co_firstlineno + 2
    assert any(w.filename == __file__ and w.lineno == line for w in seen)  # at the user's line
    assert torch.equal(compiled(x * 2), model(x * 2))  # later calls too (Dynamo skips the frame from now on)
    report = torchmux.explain(model, x)
    (skipped,) = report.not_captured
    assert (skipped.filename, skipped.lineno) == (__file__, line) and "fake tensor" in skipped.reason
    torch._dynamo.reset()
    with pytest.raises(torchmux.FullGraphError, match=f"{__file__}:{line}"):  # fullgraph=True: an error, as asked
        torchmux.compile(model, backend="eager", fullgraph=True)(x)


def test_new_shapes_recompile_and_stay_correct():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    compiled = torchmux.compile(model, backend="eager")
    for batch in (2, 3, 5):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x), model(x))


def test_graph_inputs_know_params_from_user_inputs():
    with captured_graphs() as graphs, torch.no_grad():
        torchmux.compile(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).eval(), backend="eager")(torch.randn(3, 4))
    kinds = [ir.input_kinds for ir in graphs]
    assert kinds and kinds[0].count("param") == 4 and "input" in kinds[0] and kinds[0].count("buffer") >= 2


def test_training_step_flows_forward_and_backward_graphs():
    with captured_graphs() as graphs:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
        x = torch.randn(4, 8)
        model(x).sum().backward()
        expected = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        torchmux.compile(model, backend="eager")(x).sum().backward()
    assert [ir.phase for ir in graphs] == ["forward", "backward"]
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)


def test_dynamic_true_captures_symbolic_shapes_once():
    torch._dynamo.reset()
    with captured_graphs() as graphs, torch.no_grad():
        model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
        compiled = torchmux.compile(model, backend="eager", dynamic=True)
        for batch in (2, 3, 7):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert [ir.is_static for ir in graphs] == [False]  # one symbolic graph served every batch size


def test_recompiles_are_bounded_by_dynamos_limit():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    with captured_graphs() as graphs, torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        compiled = torchmux.compile(model, backend="eager")
        for batch in range(2, 7):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))  # past the limit: eager, still right
    assert len(graphs) == 2


def test_models_of_one_class_share_compiled_code_instead_of_exhausting_the_limit():
    torch._dynamo.reset()
    with captured_graphs() as graphs, torch.no_grad():
        for _ in range(12):  # more models than Dynamo's recompile limit (8)
            model = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
            x = torch.randn(4, 16)
            torch.testing.assert_close(torchmux.compile(model, backend="eager")(x), model(x))
    assert len(graphs) == 1  # weights are graph inputs: one graph serves every instance


class _Probed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class _ProbedToo(_Probed):
    def forward(self, x):  # its own code object: its own Dynamo cache
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("mend", [True, False])
def test_calls_of_a_compiled_module_open_no_profiler_range(monkeypatch, mend):
    """Dynamo's per-call "Pregraph bytecode" range (two disabled calls around every graph, ~6 us) is
    left out of torchmux's programs, traced with record_runtime_overhead off; torch.compile keeps it,
    and the setting is back as it was after each trace."""
    from torch._dynamo import utils

    entered = []
    real = utils.record_pregraph_bytecode_enter

    @torch._dynamo.disable
    def probe():
        entered.append(1)
        return real()

    monkeypatch.setattr(utils, "record_pregraph_bytecode_enter", probe)
    before = torch._dynamo.config.record_runtime_overhead
    x = torch.randn(2, 4)
    model = _Probed()
    fast = torchmux.compile(model, backend="eager", options={"mend": mend})
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x))
        assert entered == [] and torch._dynamo.config.record_runtime_overhead == before
        plain = _ProbedToo()
        torch.testing.assert_close(torch.compile(plain, backend="eager")(x), plain(x))
    assert entered  # the probe sees torch.compile's range: torchmux's absence is real


def _compiled_with(fn, place):
    """torch.compile(fn) through the frontend with ``place``; also returns what the frontend gave Dynamo."""
    from torchmux.frontends.dynamo import TorchmuxDynamoBackend

    frontend, given = TorchmuxDynamoBackend(place), []

    def backend(gm, example_inputs):
        given.append(frontend(gm, example_inputs))
        return given[-1]

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend), given


def _reference(ir):
    def run(*args):
        return list(ir.run_reference(*args))

    return run


@pytest.mark.parametrize(
    "name, fn, grad, direct",
    [
        ("plain, no_grad", lambda x, w: torch.relu(x @ w) * 2, False, True),
        ("plain, grad mode on, no input needs grad", lambda x, w: torch.relu(x @ w) * 2, True, True),
        ("mutates an input", lambda x, w: x.mul_(2) @ w, False, False),
        ("returns an input's view", lambda x, w: (x.t(), x @ w), False, False),
        # views of an intermediate: AOTAutograd under no_grad regenerates nothing for them either
        ("returns two views of an intermediate", lambda x, w: ((x @ w).view(-1), (x @ w)[0]), False, True),
    ],
)
def test_an_inference_graph_skips_aotautograds_wrapper_only_where_it_has_nothing_to_do(name, fn, grad, direct):
    """A plain inference graph reaches Dynamo as the runner itself (no AOTAutograd runtime wrapper: its
    frames, every call); one with an input mutated or an output aliasing keeps the wrapper, which writes
    the mutation back and regenerates the views. Either way the answers, the mutation and the grad flags
    equal eager's."""
    compiled, given = _compiled_with(fn, _reference)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    x_eager = x.clone()
    with torch.set_grad_enabled(grad):
        out, expected = compiled(x, w), fn(x_eager, w)
    (returned,) = given
    assert (returned.__qualname__ == "_without_autograd.<locals>.call") == direct, returned.__qualname__
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, x_eager)
    flat = out if isinstance(out, tuple) else (out,)
    assert not any(t.requires_grad for t in flat)
    if name.startswith("returns an input's view"):
        assert out[0]._base is x  # a view of the user's tensor, as eager returns


def _sine_sum(x):
    return torch.sin(x).sum(0)


def _cosine_sum(x):  # its own code object: its own Dynamo cache
    return torch.cos(x).sum(0)


@pytest.mark.parametrize("mend", [True, False])
def test_torchmux_traces_skip_dynamos_guard_timing_and_keep_its_guards(monkeypatch, mend):
    """Dynamo times each frame's new guards (a CPU cache flush, ~20-30 ms a frame, for a debug figure);
    torchmux's traces skip that (modules; functions when mended, the only ones torchmux wraps). The
    guards still decide: a new shape recompiles. torch.compile outside torchmux keeps Dynamo's timing."""
    import torch._dynamo.guards as guards

    from torchmux.frontends.dynamo import _guard_latency, no_guard_profile

    with no_guard_profile():
        pass  # installs the hook
    real, timed = guards.profile_guard_manager._torchmux_real, []

    def spy(*args):
        timed.append(1)
        return real(*args)

    monkeypatch.setattr(guards, "profile_guard_manager", _guard_latency(spy))
    torch._dynamo.reset()
    model = _Probed()
    for program in (_sine_sum, model) if mend else (model,):
        fast = torchmux.compile(program, backend="eager", options={"mend": mend})
        with torch.no_grad():
            for shape in ((2, 4), (2, 4), (3, 4)):
                x = torch.randn(shape)
                torch.testing.assert_close(fast(x), program(x))
    assert timed == []
    torch.testing.assert_close(torch.compile(_cosine_sum, backend="eager")(x), _cosine_sum(x))
    assert timed == [1]
