"""Keep or revert (frontends/mend/verdict.py): the mend pass's rewrites stay only where the rewritten
capture is no worse than Dynamo's on the code as written; the second capture only where in doubt."""

from __future__ import annotations

import inspect
import io
import random
import warnings
from contextlib import redirect_stdout

import pytest
import torch
import torch.nn as nn
from torch.autograd import Variable

import torchmux
from torchmux.frontends.mend import runtime as rt
from torchmux.frontends.mend import verdict
from torchmux.frontends.mend.pipeline import MEND_DIR


def explain(model: nn.Module, *args: torch.Tensor, **kw: object) -> torchmux.ExplainReport:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchmux.explain(model, *args, **kw)


class AliasedGrad(nn.Module):
    """``Variable(x)`` of an input, then ``requires_grad`` set through an alias: Dynamo takes it whole;
    ``t.detach()`` of a graph value would break where ``requires_grad`` is set."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = Variable(x)
        w = z
        w.requires_grad = True
        return (w * 2).sum()


def _needs_grad(t: torch.Tensor) -> None:
    t.requires_grad = True


class HelperGrad(nn.Module):
    """The same, with requires_grad set in a helper: the source of ``forward`` does not show it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = Variable(x)
        _needs_grad(z)
        return (z * 2).sum()


class DirectGrad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = Variable(x)
        z.requires_grad = True
        return (z * 2).sum()


class TensorIf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.sum() > 0:
            h = h * 2
        else:
            h = h - 1
        print("done")
        return h


class MaskedSizeIf(nn.Module):
    """An if on a data-dependent size: the mend runtime's own break at the user's if (in doubt)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picked = x[x > 0]
        if picked.size(0) == 0:
            y = x * 0
        else:
            y = x + picked.sum()
        return y


def test_a_rewrite_that_breaks_where_dynamo_did_not_is_reverted() -> None:
    """The requires_grad case of real code: the legacy rewrite is left out statically (``z`` gets
    requires_grad set), and where the source does not show it, the verdict reverts it."""
    x = torch.randn(2, 4)
    for cls in (AliasedGrad, DirectGrad, HelperGrad):
        plain = explain(cls(), x, mend=False)
        report = explain(cls(), x)
        assert (plain.graph_count, plain.graph_break_count) == (1, 0)
        assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
        assert not any("Variable" in r for r in report.rewrites)
        if cls is HelperGrad:  # rewritten (the source does not show the setattr), broke, reverted
            assert "broke 1 times, the code as written 0" in report.reverted[0]
            assert any("Variable(t) -> t.detach()" in r for r in report.reverted[1:])
            assert "Rewrites not kept" in str(report)
        else:
            assert not report.reverted


def test_requires_grad_source_check_sees_aliases() -> None:
    from torchmux.frontends.mend import source_of

    assert "detach" not in source_of(AliasedGrad.forward)
    assert "detach" not in source_of(DirectGrad.forward)


def test_breaks_inside_a_fired_rewrite_are_in_doubt_others_are_not() -> None:
    model, x = TensorIf().eval(), torch.randn(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with redirect_stdout(io.StringIO()):
            report = torchmux.explain(model, x)
    assert report.graph_break_count == 0 and any("torch." in r for r in report.rewrites)
    lines, start = inspect.getsourcelines(TensorIf.forward)
    keys = [k for k, (f, a, _, _) in rt.SPANS.items() if f == __file__ and start <= a < start + len(lines)]
    fired = [k for k in keys if k in rt.FIRED]
    assert fired, "the if rewrite fired while Dynamo traced"
    first, last = min(rt.SPANS[k][1] for k in fired), max(rt.SPANS[k][2] for k in fired)
    assert last > first  # the span is the whole if statement, not its first line
    inside = [[("/elsewhere/caller.py", 3), (__file__, last)]]
    outside = [[(__file__, last + 1)]]
    runtime = [[(__file__, first - 1), (MEND_DIR + "runtime.py", 10)]]
    assert verdict.in_doubt(inside, fired)
    assert verdict.in_doubt(runtime, fired)
    assert not verdict.in_doubt(outside, fired)  # Dynamo's own break on the user's statements
    assert not verdict.in_doubt([], fired)  # one graph: nothing to compare
    assert not verdict.in_doubt(inside, [k for k in keys if k not in rt.FIRED])  # nothing fired


def test_keep_compares_breaks_then_time() -> None:
    C = verdict.Capture
    assert verdict.keep(C(1, 1.0, 2), C(1, 0.6, 2)) == ""
    assert verdict.keep(C(0, 1.0, 1), C(2, 0.6, 3)) == ""
    assert "broke 2 times" in verdict.keep(C(2, 0.1, 3), C(1, 1.0, 2))
    assert "no graph" in verdict.keep(C(1, 0.1, 0), C(1, 1.0, 1))  # as many breaks, the frame skipped whole
    assert "over twice" in verdict.keep(C(1, 2.1, 2), C(1, 1.0, 2))
    assert verdict.keep(C(1, 2.1, 2), C(1, 1.0, 2), timed=False) == ""  # a process's first capture: breaks only


class _PACTClip(torch.autograd.Function):
    """PACT's clipped ReLU as pytorch-ignite's example writes it (ParityBench's ninth sample): the clip's
    bound read through ``alpha.data`` as a Python number (an ``.item()``)."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x, alpha)
        return torch.clamp(x, 0, alpha.data)

    @staticmethod
    def backward(ctx, dy):
        x, alpha = ctx.saved_tensors
        dx = dy.clone()
        dx[x < 0] = 0
        dx[x > alpha] = 0
        dalpha = dy.clone()
        dalpha[x <= alpha] = 0
        return dx, torch.sum(dalpha)


class PACTReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(6.0))

    def forward(self, x):
        return _PACTClip.apply(x, self.alpha)


def test_switches_that_make_dynamo_give_up_on_the_frame_are_reverted() -> None:
    """With ``capture_scalar_outputs`` Dynamo fails inside the Function (an unbacked float it loses) and
    skips the whole frame: as many breaks as the code as written, but no graph where that code gives
    one. The verdict takes the code as written (its graph), in explain and in compile()."""
    model, x = PACTReLU(), torch.randn(4, 8) * 10
    plain = explain(model, x, mend=False)
    assert plain.graph_count >= 1
    report = explain(model, x)
    assert (report.graph_count, report.graph_break_count) == (plain.graph_count, plain.graph_break_count)
    assert any("no graph" in r for r in report.reverted), report.reverted
    torch.testing.assert_close(torchmux.compile(model, backend="eager")(x), model(x))


def test_in_doubt_capture_is_judged_and_kept_when_no_worse() -> None:
    """The data-dependent size if breaks in the rewritten capture at the user's if (the runtime's own
    break): the code as written is captured too (on copies); it breaks there as well, so the rewrites
    stay, and the answer is eager's."""
    model = MaskedSizeIf()
    for x in (torch.randn(3, 4), -torch.ones(3, 4)):
        report = explain(model, x)
        plain = explain(model, x, mend=False)
        assert report.graph_break_count <= plain.graph_break_count
        compiled = torchmux.compile(model, backend="eager")
        torch.testing.assert_close(compiled(x), model(x))


def test_the_measuring_capture_leaves_the_user_state_alone() -> None:
    """What the second capture runs on is a copy, under restored random state, printing nothing."""
    model = DirectGrad()
    x = torch.randn(2, 4)
    before = torch.random.get_rng_state()
    out = io.StringIO()
    with redirect_stdout(out), verdict.shadowed():
        m, (a,), _ = verdict.copies(model, (x,), {})
        torch.rand(3)
        print("not shown")
    assert out.getvalue() == ""
    assert torch.equal(torch.random.get_rng_state(), before)
    assert a is not x and torch.equal(a, x) and m is not model


def test_compile_reverts_a_rewrite_that_breaks_where_dynamo_did_not() -> None:
    """The verdict in ``torchmux.compile`` (api/compile.py ``_Verdict``): after the first call, a module
    whose rewritten capture broke where the code as written does not gets its own methods back, and
    its next call is captured as written, in one graph; answers as eager's throughout. A rewrite whose
    capture is not in doubt stays."""
    from torch._dynamo.utils import counters

    x = torch.randn(2, 4)
    model = HelperGrad()
    compiled = torchmux.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert "forward" in vars(model)  # compile() bound the mended forward ...
        torch.testing.assert_close(compiled(x), HelperGrad()(x))
        assert "forward" not in vars(model)  # ... and taken back: the user's forward runs
        torch.testing.assert_close(compiled(x), HelperGrad()(x))  # captured as written
        graphs = counters["stats"]["unique_graphs"]
        torch.testing.assert_close(compiled(x), HelperGrad()(x))
    assert counters["stats"]["unique_graphs"] == graphs  # no capture after the second call

    kept, y = TensorIf().eval(), torch.randn(2, 4)
    compiled = torchmux.compile(kept, backend="eager")
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.testing.assert_close(compiled(y), TensorIf.forward(kept, y))  # the class's forward: as written
    assert "forward" in vars(kept)  # its if became torch.cond and the capture is one graph: kept


def test_compile_keeps_the_rewrites_of_a_module_too_large_to_copy(monkeypatch) -> None:
    """The verdict copies the module; past ``VERDICT_COPY_BYTES`` of weights it is not taken (the rewrites
    stay, answers as eager's)."""
    from torchmux.api import compile as api_compile

    monkeypatch.setattr(api_compile, "VERDICT_COPY_BYTES", -1)
    x, model = torch.randn(2, 4), HelperGrad()
    compiled = torchmux.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(compiled(x), HelperGrad()(x))
    assert "forward" in vars(model)  # no verdict: the mended forward stays


class _RandomCrop(nn.Module):
    """ParityBench's RandomCrop (archinetai/audio-data-pytorch): the branch not taken pads by a negative amount."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        start = random.randint(0, max(length - self.size, 0))
        x = x[:, start:]
        channels, length = x.shape
        if length < self.size:
            padding_length = self.size - length
            padding = torch.zeros(channels, padding_length)
            return torch.cat([x, padding], dim=1)
        else:
            return x[:, 0 : self.size]


def test_a_branch_that_sizes_a_tensor_from_the_data_never_runs_when_not_taken() -> None:
    """Both sides of a tensor if run only when neither can raise on some data: ``torch.zeros`` with a size
    computed from it is negative where its branch is not taken (the speculated graph asserted that it was
    not, and raised on most calls)."""
    model = _RandomCrop(10).eval()
    compiled = torchmux.compile(model, backend="eager")
    x = torch.randn(2, 40)
    windows = [x[:, s : s + 10] for s in range(31)]  # what eager returns: a random window of x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(8):
            got = compiled(x)  # before: "Runtime assertion failed for expression u1 <= 10" on most calls
            assert any(torch.equal(got, w) for w in windows)
    assert rt.COND is True  # the process's torch.cond switch is left on


@pytest.mark.parametrize("width", [9, 4, 2])
def test_random_crop_is_one_graph_drawing_pythons_numbers(width: int) -> None:
    """``random.randint``'s number gets its range (``items.drawn_range``), and the if on the cropped length,
    which that range decides, runs in the graph as written: one graph at every width, eager's crops."""
    x = torch.randn(3, width)
    report = explain(_RandomCrop(4), x)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert any("random.randint" in r for r in report.rewrites), report.rewrites
    torch._dynamo.reset()
    compiled = torchmux.compile(_RandomCrop(4), backend="eager")
    for seed in range(4):  # the same draws from Python's generator as eager makes, so the same crops
        random.seed(seed)
        got = compiled(x)
        random.seed(seed)
        torch.testing.assert_close(got, _RandomCrop(4)(x), rtol=0, atol=0)


class _ActNorm(nn.Module):
    """ParityBench's Glow ``ActNorm`` (rosinality/glow-pytorch): a data-dependent first-call initialization
    on ``.item()``, first in ``forward``. Dynamo breaks at the ``.item()``, before any op (one graph, no
    break counted); under the mend pass's ``capture_scalar_outputs`` the ``.item()`` enters a graph and the
    ``if`` on it breaks after (two graphs, one break). No rewrite fires: the switches alone did it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.scale = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def initialize(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            flat = x.permute(1, 0, 2, 3).contiguous().view(x.shape[1], -1)
            self.loc.data.copy_(-flat.mean(1).view(1, -1, 1, 1))
            self.scale.data.copy_(1 / (flat.std(1).view(1, -1, 1, 1) + 1e-6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, _, height, width = x.shape
        if self.initialized.item() == 0:
            self.initialize(x)
            self.initialized.fill_(1)
        logdet = height * width * torch.sum(torch.log(torch.abs(self.scale)))
        return self.scale * (x + self.loc), logdet


def test_switches_that_break_where_dynamo_did_not_are_judged_and_turned_off() -> None:
    """The mend pass's switches are judged like its rewrites (``verdict.switched``): explain reports the
    capture of the code as written (one graph, as Dynamo), saying why; ``torchmux.compile`` turns the
    switches off for the module after its first call and drops that call's graphs, so its second call is
    captured as Dynamo captures it (one graph) and nothing after; eager's answers and first-call
    initialization throughout."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    x = torch.rand(4, 3, 5, 5)
    plain, report = explain(_ActNorm(3), x, mend=False), explain(_ActNorm(3), x)
    assert (plain.graph_count, plain.graph_break_count) == (1, 0)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    assert "broke 1 times, the code as written 0" in report.reverted[0]

    model, reference = _ActNorm(3), _ActNorm(3)
    compiled = torchmux.compile(model, backend="eager")
    new_graphs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            before = counters["stats"]["unique_graphs"]
            torch.testing.assert_close(compiled(x), reference(x))
            new_graphs.append(counters["stats"]["unique_graphs"] - before)
    assert new_graphs[1:] == [1, 0, 0], new_graphs  # traced again once, nothing after
    # as written: the forward breaks at the .item() before any op (no graph of its own, as under Dynamo
    # alone); under the switches it ran a graph holding the .item(), then broke at the if
    entries = _debug_get_cache_entry_list(_ActNorm.forward.__code__)
    assert entries and not any("__compiled_fn" in n for e in entries for n in e.code.co_names)
    torch.testing.assert_close(model.scale, reference.scale)  # initialized once, from the first call's data
    assert int(model.initialized) == 1


def test_a_break_on_a_data_dependent_value_may_be_the_switches() -> None:
    assert verdict.switched(
        ["generic_jump SymNodeVariable() ... Could not guard on data-dependent expression Eq(u0, 0)"]
    )
    assert verdict.switched(["Data-dependent branching"])
    assert not verdict.switched(["call_function UserDefinedObjectVariable(print)", "Unsupported: setattr()"])
    assert not verdict.switched([])
