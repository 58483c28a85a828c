"""The mend rules for research code's breaks: RNN modules, attribute dicts, Python tests of tensor data.

Each rule is checked for one graph where it applies, eager's values (and gradients), and the original
behaviour where it does not apply.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.autograd import Variable
from torch.nn.utils.rnn import pack_padded_sequence

import torchmux


def explain(model, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchmux.explain(model, *args, backend="eager")


def compiled(model):
    torch._dynamo.reset()
    return torchmux.compile(model, backend="eager")


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


# --- rnn.py: nn.LSTM / nn.GRU / nn.RNN written out in tensor ops -------------------------------------


class Recurrent(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(2 * 8, 3)

    def forward(self, x, hx=None):
        out, h = self.rnn(x, hx)
        return self.head(out[:, -1]), h


RNNS = [
    lambda: nn.LSTM(5, 8, num_layers=2, bidirectional=True, batch_first=True),
    lambda: nn.GRU(5, 8, num_layers=2, bidirectional=True, batch_first=True),
    lambda: nn.RNN(5, 8, num_layers=2, bidirectional=True, batch_first=True, nonlinearity="relu"),
]


@pytest.mark.parametrize("make", RNNS, ids=["lstm", "gru", "rnn"])
def test_rnn_module_is_one_graph_with_eagers_values_and_gradients(make) -> None:
    torch.manual_seed(0)
    model = Recurrent(make())
    x = torch.randn(3, 6, 5)
    hx = torch.randn(4, 3, 8)
    hx = (hx, torch.randn(4, 3, 8)) if isinstance(model.rnn, nn.LSTM) else hx
    rep = explain(model, x, hx)
    assert (rep.graph_count, rep.graph_break_count) == (1, 0)
    assert any("recurrence in tensor ops" in r for r in rep.rewrites)
    fast = compiled(model)
    got, want = fast(x, hx), model(x, hx)
    for a, b in zip(_flat(got), _flat(want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    _flat(got)[0].sum().backward()  # under autograd (AOTAutograd could not run torch.lstm there)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _flat(want)[0].sum().backward()
    for a, b in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make", RNNS + [lambda: nn.LSTM(5, 8), lambda: nn.GRU(5, 8, bias=False)])
@pytest.mark.parametrize("batched", [True, False])
def test_rnn_op_kernels_agree_shape_pass_real_kernel_and_written_out(make, batched) -> None:
    """The op's three kernels: Dynamo's shape pass (fake tensors) gives the written-out recurrence's
    shapes; on real tensors needing no gradient it is the module's own kernel, bit for bit; needing one,
    it is the written-out recurrence, whose values and gradients are eager's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchmux.frontends.mend import rnn

    torch.manual_seed(0)
    m = make()
    kind = "lstm" if isinstance(m, nn.LSTM) else "gru" if isinstance(m, nn.GRU) else m.nonlinearity
    dirs = 2 if m.bidirectional else 1
    x = torch.randn(3, 6, 5) if batched else torch.randn(6, 5)
    params = [getattr(m, n) for n in m._flat_weights_names]
    args = (x, [], params, kind, m.num_layers, dirs, m.batch_first, m.bias)
    with torch.no_grad():
        real = rnn._OP(*args)
        want = m(x)
    assert all(torch.equal(a, b) for a, b in zip(real, _flat(want)))
    unrolled = rnn._OP(*args)  # the parameters need a gradient: the written-out ops
    for a, b in zip(unrolled, real):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    unrolled[0].sum().backward()
    grads = [p.grad.clone() for p in params]
    m.zero_grad()
    _flat(m(x))[0].sum().backward()
    for a, b in zip(grads, [p.grad for p in params]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = rnn._OP(mode.from_tensor(x), [], [mode.from_tensor(p) for p in params], *args[3:])
    assert [f.shape for f in fake] == [r.shape for r in real]
    assert all(f.requires_grad for f in fake)  # as the written-out ops' outputs would


def test_rnn_outside_dynamo_runs_the_class_forward_and_packed_input_runs_eagerly() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 8, batch_first=True)
    model = Recurrent(nn.LSTM(5, 16, batch_first=True))
    fast = compiled(model)
    x = torch.randn(2, 4, 5)
    fast(x)
    assert "forward" in vars(model.rnn)  # installed on the instance only
    assert "forward" not in vars(lstm) and type(model.rnn).forward is nn.LSTM.forward
    out_mended, _ = model.rnn(x)  # no Dynamo: the class's own forward, bit for bit
    out_plain, _ = nn.LSTM.forward(model.rnn, x)
    assert torch.equal(out_mended, out_plain)

    class Packed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(5, 8, batch_first=True)

        def forward(self, x, lengths):
            _, h = self.rnn(pack_padded_sequence(x, lengths, batch_first=True))
            return h[-1] * 2

    packed, lengths = Packed(), torch.tensor([4, 2])
    torch.testing.assert_close(compiled(packed)(x, lengths), packed(x, lengths))


def test_rnn_on_a_packed_sequence_is_called_untraced_as_dynamo_leaves_it() -> None:
    """DeepSpeech's ``BatchRNN`` (ParityBench's eighth sample): an LSTM fed a ``PackedSequence``, whose batch
    sizes are data. Tracing the class's forward under ``allow_rnn`` got deep into ``_VF.lstm`` before giving
    up (twice Dynamo's capture time); now the call is not traced at all (a ``torch.compiler.disable``d call),
    no more breaks than Dynamo alone gives, eager's answer."""
    import torch._dynamo.utils as dynamo_utils
    from torch.nn.utils.rnn import pad_packed_sequence

    class Speech(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.rnn = nn.LSTM(4, 4)

        def forward(self, x, lengths):
            t, n = x.shape[:2]
            x = pack_padded_sequence(self.bn(x.view(t * n, -1)).view(t, n, -1), lengths)
            x, _ = self.rnn(x)
            return pad_packed_sequence(x)[0]

    torch.manual_seed(0)
    model, x, lengths = Speech().eval(), torch.rand(4, 4, 4), torch.tensor([4, 3, 2, 2])
    torch._dynamo.reset()
    plain = torch._dynamo.explain(model)(x, lengths)
    dynamo_utils.counters.clear()
    report = explain(model, x, lengths)
    assert report.graph_break_count <= len(plain.break_reasons), (str(report), plain.break_reasons)
    assert any("disable()`d function" in k for k in dynamo_utils.counters["graph_break"]), dynamo_utils.counters
    torch.testing.assert_close(compiled(model)(x, lengths), model(x, lengths))


def test_rnn_longer_than_the_step_limit_is_a_graph_run_eagerly(monkeypatch) -> None:
    from torchmux.frontends.mend import rnn

    monkeypatch.setattr(rnn, "MAX_STEPS", 4)
    torch.manual_seed(0)
    model, x = Recurrent(nn.GRU(5, 16, batch_first=True)), torch.randn(2, 6, 5)
    rep = explain(model, x)
    assert any(g.error and "nn.LSTM/GRU/RNN" in g.error for g in rep.graphs)  # explain says it ran eagerly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(model)(x)[0]
    torch.testing.assert_close(got, model(x)[0])
    got.sum().backward()


def test_rnn_dynamo_reaches_unmended_is_run_as_captured_not_crashed() -> None:
    """An RNN that is not a submodule (in a plain list) reaches the graph as torch.lstm under allow_rnn:
    the graph runs as Dynamo captured it, with eager's values and gradients."""
    torch.manual_seed(0)

    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 2)
            self.rnns = [nn.LSTM(5, 8)]  # not registered: mend does not see it

        def forward(self, x):
            out, _ = self.rnns[0](x)
            return self.fc(out[-1])

    model, x = Hidden(), torch.randn(4, 3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(model)(x)
    torch.testing.assert_close(got, model(x))
    got.sum().backward()


# --- attrs.py: attribute dicts (``__getattr__ = dict.__getitem__``) ---------------------------------


class AttrDict(dict):
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class LooseDict(dict):
    __getattr__ = dict.get  # a missing key reads as None


GLOBAL_CFG = AttrDict(shift=1.5)


class Configured(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        cfg = self.cfg
        y = self.fc(x) * self.cfg.model.scale + GLOBAL_CFG.shift  # nested, and a global
        if cfg.bias is not None:  # an alias; LooseDict reads a missing key as None
            y = y + cfg.bias
        return y * len(self.cfg.keys())  # a method of dict stays a method call


@pytest.mark.parametrize("cls", [AttrDict, LooseDict])
def test_attribute_dict_config_is_one_graph_with_eagers_values(cls) -> None:
    cfg = cls(model=cls(scale=0.5), bias=2.0) if cls is AttrDict else cls(model=cls(scale=0.5))
    model, x = Configured(cfg), torch.randn(3, 4)
    rep = explain(model, x)
    assert (rep.graph_count, rep.graph_break_count) == (1, 0)
    assert sum("attribute dict read" in r for r in rep.rewrites) >= 3
    torch.testing.assert_close(compiled(model)(x), model(x))


def test_attribute_dict_missing_key_raises_keyerror_as_eager() -> None:
    model, x = Configured(AttrDict(model=AttrDict(), bias=None)), torch.randn(3, 4)
    with pytest.raises(KeyError, match="scale"):
        model(x)
    with pytest.raises(KeyError, match="scale"):
        compiled(model)(x)


def test_plain_objects_are_not_rewritten() -> None:
    from types import SimpleNamespace

    from torchmux.frontends.mend import source_of

    model = Configured(SimpleNamespace(model=SimpleNamespace(scale=0.5), bias=None, keys=lambda: [1]))
    torchmux.frontends.mend.mend(model)
    source = source_of(model.forward)
    assert "self.cfg.model.scale" in source and "cfg.bias" in source  # not attribute dicts: as written
    assert "'shift')" in source  # the global is one
    torch.testing.assert_close(compiled(model)(torch.ones(1, 4)), model(torch.ones(1, 4)))


# --- runtime.data_test: a bool Dynamo holds symbolically is a tensor test ---------------------------


def _is_positive(v):
    return v.mean().item() > 0.0  # a Python bool made of tensor data, returned by a helper


def sign_shift(x):
    if _is_positive(x):
        return x + 1
    return x - 1


def masked_mean_or_zero(x):
    kept = x[x.abs() < 0.5]
    return kept.mean() if kept.numel() > 0 else torch.zeros(())


def argmax_is(x):
    if x.sum(0).argmax().item() == 2:  # an int .item(): compared as a symbolic int, exactly
        x = x * 2
    return x - 1


@pytest.mark.parametrize("fn", [sign_shift, masked_mean_or_zero, argmax_is], ids=lambda f: f.__name__)
def test_symbolic_bool_tests_are_one_graph_and_take_both_ways(fn) -> None:
    torch.manual_seed(0)
    rep = explain(fn, torch.randn(4, 3))
    assert (rep.graph_count, rep.graph_break_count) == (1, 0)
    fast = compiled(fn)
    inputs = [torch.randn(4, 3), -torch.rand(4, 3) - 1, torch.rand(4, 3) + 1, torch.eye(4, 3) * 5]
    for x in inputs:  # one compiled graph gives each way's value (an empty selection included)
        torch.testing.assert_close(fast(x), fn(x))


def test_constant_bools_stay_python() -> None:
    from torchmux.frontends.mend import runtime as rt

    def f(x, n):
        return x + (1 if isinstance(rt.data_test(n == 1), bool) else 2)

    torch._dynamo.reset()
    x = torch.zeros(2)
    torch.testing.assert_close(torch.compile(f, backend="eager")(x, 1), f(x, 1))
    torch.testing.assert_close(f(x, 1), torch.ones(2))


# --- analysis.pure_forward: user blocks whose forward is side-effect free --------------------------


class PureBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        h = self.fc(x)
        return self.act(h) + x


class CountingBlock(PureBlock):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # a side effect: the loop must run as written
        return self.fc(x) + x


class EarlyExit(nn.Module):
    def __init__(self, block: type[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([block() for _ in range(4)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            if x.norm() > 6:
                break
        return x


def test_loop_over_pure_user_blocks_with_a_break_is_one_graph() -> None:
    torch.manual_seed(0)
    model = EarlyExit(PureBlock).eval()
    x = torch.randn(2, 4)
    rep = explain(model, x)
    assert (rep.graph_count, rep.graph_break_count) == (1, 0)
    fast = compiled(model)
    with torch.no_grad():
        for scale in (0.1, 1.0, 3.0):  # stops after 1, some or no blocks
            torch.testing.assert_close(fast(x * scale), model(x * scale))


def test_loop_over_user_blocks_with_side_effects_runs_as_written() -> None:
    torch.manual_seed(0)
    model = EarlyExit(CountingBlock).eval()
    x = torch.randn(2, 4) * 3
    with torch.no_grad():
        want = model(x)
        calls = [b.calls for b in model.blocks]
        got = compiled(model)(x)
    torch.testing.assert_close(got, want)
    assert [b.calls for b in model.blocks] == [2 * c for c in calls]  # the same blocks ran, once more each


# --- loops.break_convert: the break test mid-body, over range(n) ------------------------------------


def damped_fixed_point(x):
    z = torch.zeros_like(x)
    for _ in range(8):
        z_new = 0.5 * z + x
        if (z_new - z).abs().max() < 0.1:
            break
        z = z_new  # after the test: counts only when the loop went on
    return z


def test_fixed_point_loop_with_a_mid_body_break_is_one_graph_for_every_exit() -> None:
    x = torch.ones(2, 3)
    rep = explain(damped_fixed_point, x)
    assert (rep.graph_count, rep.graph_break_count) == (1, 0)
    assert any("masked loop" in r for r in rep.rewrites)
    fast = compiled(damped_fixed_point)
    for scale in (0.05, 0.3, 1.0, 3.0, 100.0):  # breaks at the first, a middle or no iteration
        torch.testing.assert_close(fast(x * scale), damped_fixed_point(x * scale))


# --- items.py: random.randint's number, with the range Dynamo is told (the crop: test_mend_verdict.py) ---


def test_randint_range_rule_leaves_other_draws_and_keywords_alone() -> None:
    class Draws(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            k = random.randint(a=0, b=2)  # keywords: not rewritten
            return x * k + random.random()

    report = explain(Draws(), torch.ones(2))
    assert not any("random.randint" in r for r in report.rewrites), report.rewrites


# --- items.py: np.prod of a shape ---------------------------------------------------------------------------


class _Flatten(nn.Module):  # a flatten's width as research code writes it
    shape = (4, 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.view(x.size(0), int(np.prod(x.size()[1:])))
        b = x.view(-1, np.prod(self.shape))  # a tuple attribute; no int(): NumPy's own number as a size
        c = x.view(x.size(0), np.prod(x.shape[1:]))
        return a + b * c


class _NearestEmbedFunc(torch.autograd.Function):  # a VQ-VAE's, as copied between repositories
    @staticmethod
    def forward(ctx, input, emb):
        ctx.batch_size = input.size(0)
        ctx.num_latents = int(np.prod(np.array(input.size()[2:])))
        flat = input.permute(0, 2, 3, 1).reshape(ctx.batch_size * ctx.num_latents, -1)
        argmin = (flat.unsqueeze(-1) - emb.unsqueeze(0)).norm(2, 1).min(-1)[1]
        return emb.t().index_select(0, argmin).view(ctx.batch_size, *input.shape[2:], -1).permute(0, 3, 1, 2)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output, None


class _Quantize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Parameter(torch.randn(3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _NearestEmbedFunc.apply(x, self.emb.detach())


@pytest.mark.parametrize("make", [_Flatten, _Quantize], ids=["flatten", "vq_vae"])
def test_np_prod_of_a_shape_is_a_number_dynamo_knows(make) -> None:
    """``np.prod`` of a shape (a tensor's size, a slice of it, a tuple attribute; through ``np.array`` too)
    is the product of its sizes while Dynamo traces: one graph where Dynamo alone breaks on the number it
    reads back from NumPy's tensor (and, without ``int()``, skipped the frame under torchmux's switches),
    eager's values, no ``.item()`` left in the graph."""
    torch.manual_seed(0)
    model, x = make(), torch.randn(2, 3 if make is _Quantize else 4, 3, 3)
    torch._dynamo.reset()
    plain = torch._dynamo.explain(model)(x)
    report = explain(model, x)
    assert plain.graph_break_count >= 1
    assert (report.graph_count, report.graph_break_count) == (1, 0), report
    assert any("np.prod" in r for r in report.rewrites), report.rewrites
    torch.testing.assert_close(compiled(model)(x), model(x))


def test_np_prod_keeps_numpys_number_outside_dynamo_and_off_shapes() -> None:
    """Run as Python (not traced), or given what is not a shape, the call is NumPy's as written: an
    ``np.int64``, ``1.0`` for no sizes, a float product of floats."""
    from torchmux.frontends.mend import runtime as rt

    six = rt.size_prod(0, torch.Size([2, 3]), False)
    assert six == 6 and isinstance(six, np.integer)
    assert rt.size_prod(0, (), True) == 1.0 and isinstance(rt.size_prod(0, (), True), float)
    assert rt.size_prod(0, [0.5, 4.0], False) == 2.0


# --- legacy.py: an autograd.Function whose backward only raises ------------------------------------------


class Nearest(torch.autograd.Function):
    """A vector quantizer's code lookup as research code writes it: indices, marked non-differentiable."""

    @staticmethod
    def forward(ctx, inputs, codebook):
        with torch.no_grad():
            distances = torch.cdist(inputs.reshape(-1, codebook.size(1)), codebook)
            indices = distances.argmin(dim=1).view(*inputs.shape[:-1])
            ctx.mark_non_differentiable(indices)
            return indices

    @staticmethod
    def backward(ctx, grad_output):
        raise RuntimeError("Nearest is not differentiable: use the straight-through one")


class Rounded(torch.autograd.Function):
    """Backward raises too, but its float output is differentiable: a backward through it must raise."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        raise RuntimeError("Rounded has no gradient")


nearest = Nearest.apply


class Quantizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.codebook = nn.Parameter(torch.randn(16, 4))  # needs gradients: Dynamo would trace the backward

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return nearest(z.permute(0, 2, 3, 1).contiguous(), self.codebook) + 1


def test_function_whose_backward_only_raises_is_one_graph_with_eagers_indices() -> None:
    model, z = Quantizer(), torch.randn(2, 4, 3, 3)
    rep = explain(model, z)  # as written: Dynamo traces the backward, meets its raise and skips the frame
    assert (rep.graph_count, rep.graph_break_count, rep.not_captured) == (1, 0, []), rep.not_captured
    assert any("Nearest.apply: forward only" in r for r in rep.rewrites), rep.rewrites
    fast = compiled(model)
    for _ in range(2):
        z = torch.randn(2, 4, 3, 3)
        out, want = fast(z), model(z)
        assert torch.equal(out, want) and out.requires_grad == want.requires_grad == False  # noqa: E712


def test_function_with_a_differentiable_output_keeps_its_raising_backward() -> None:
    def rounded(x: torch.Tensor) -> torch.Tensor:
        return Rounded.apply(x * 2)

    rep = explain(rounded, torch.ones(3, requires_grad=True))
    assert not any("forward only" in r for r in rep.rewrites), rep.rewrites
    out = compiled(rounded)(torch.ones(3, requires_grad=True))
    assert out.requires_grad and torch.equal(out.detach(), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="Rounded has no gradient"):
        out.sum().backward()


# --- legacy.py: a backward that reads ctx.saved_variables ---------------------------------------------


class OldLinear(torch.autograd.Function):
    """A 2017 custom layer: its backward reads the pre-0.4 name ``saved_variables`` (it warns in eager)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_variables
        return grad_output @ weight, grad_output.t() @ x


def old_linear(x, weight):
    return OldLinear().apply(x, weight)  # the instance form of the same era


old_linear_fn = OldLinear.apply  # and the alias form


class OldNet(nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4))  # needs gradients: Dynamo traces the backward
        self.form = form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "Fn().apply":
            y = old_linear(x, self.weight)
        elif self.form == "alias":
            y = old_linear_fn(x, self.weight)
        else:
            y = OldLinear.apply(x, self.weight)
        return torch.tanh(y) * 2


@pytest.mark.parametrize("form", ["Fn.apply", "Fn().apply", "alias"])
def test_backward_reading_saved_variables_is_one_graph_with_eagers_gradients(form: str) -> None:
    model, x = OldNet(form), torch.randn(3, 4)
    rep = explain(model, x)  # as written: Dynamo meets saved_variables in the backward and skips the frame
    assert (rep.graph_count, rep.graph_break_count, rep.not_captured) == (1, 0, []), rep.not_captured
    assert any("OldLinear.backward: ctx.saved_variables -> ctx.saved_tensors" in r for r in rep.rewrites), rep.rewrites
    fast = compiled(model)
    want_model = OldNet(form)
    want_model.load_state_dict(model.state_dict())
    for _ in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        out = fast(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # eager's saved_variables
            want = want_model(x2)
            want.sum().backward()
        out.sum().backward()
        assert out.grad_fn is not None  # compared within float32 rounding: the traced backward may sum in another order
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x.grad, x2.grad)
        torch.testing.assert_close(model.weight.grad, want_model.weight.grad)
        model.zero_grad()
        want_model.zero_grad()
    assert type(OldLinear.apply(torch.ones(1, 4), model.weight).grad_fn).__name__ == "OldLinearBackward"


class Shake(torch.autograd.Function):
    """A shake-shake mix of two branches (2017): the backward wraps its mixing weights in ``Variable``, as
    code of that era did (here the weights are fixed, so that gradients can be compared)."""

    @staticmethod
    def forward(ctx, x1, x2):
        return 0.5 * x1 + 0.5 * x2

    @staticmethod
    def backward(ctx, grad_output):
        beta = torch.full((grad_output.size(0), 1), 0.25).expand_as(grad_output)
        beta = Variable(beta)
        return beta * grad_output, (1 - beta) * grad_output


class ShakeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)  # parameters: Dynamo traces the backward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(Shake.apply(self.a(x), self.b(x)))


def test_backward_wrapping_a_tensor_in_variable_is_one_graph_with_eagers_gradients() -> None:
    model, x = ShakeNet(), torch.randn(3, 4)
    rep = explain(model, x)  # as written: Dynamo skips Variable in the backward, and the frame with it
    assert (rep.graph_count, rep.graph_break_count, rep.not_captured) == (1, 0, []), rep.not_captured
    assert any("Shake.backward: Variable(t) -> t.detach()" in r for r in rep.rewrites), rep.rewrites
    fast, want_model = compiled(model), ShakeNet()
    want_model.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)
    out, want = fast(x), want_model(x)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(out, want)
    for p, q in zip(model.parameters(), want_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert Shake.backward.__code__.co_names.count("Variable") == 1  # the class itself is left as written


def test_a_backward_that_reads_saved_tensors_is_left_as_written() -> None:
    class NewLinear(OldLinear):  # the same layer as a later release writes its backward
        @staticmethod
        def backward(ctx, grad_output):
            x, weight = ctx.saved_tensors
            return grad_output @ weight, grad_output.t() @ x

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return NewLinear.apply(x, w) + 1

    rep = explain(f, torch.randn(3, 4), torch.randn(5, 4, requires_grad=True))
    assert not any("saved_variables" in r for r in rep.rewrites), rep.rewrites
