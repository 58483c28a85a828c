"""Recurrent modules (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) -> their recurrence in plain tensor ops.

Dynamo refuses to trace an RNN module unless ``allow_rnn`` is on, and with it the module becomes one
``torch.lstm`` / ``torch.gru`` call that AOTAutograd cannot run under autograd in torch 2.13 (it saves the
parameters themselves: "expected all tensors_saved_with_vc_check to be Tensors"). So for every submodule
whose class is exactly one of the three, :func:`install` binds :func:`forward` to the *instance*:

- while Dynamo traces, for a supported call (a tensor input, no ``proj_size``, no dropout in training,
  at most :data:`MAX_STEPS` recurrent steps), the call becomes one ``torchmux_mend::rnn`` op. Dynamo
  records one node and runs a shape-only kernel for it (capture costs the same for 5 steps or 100);
  AOTAutograd decomposes it into the recurrence written out in ``matmul`` and pointwise ops (the input
  projection of all steps in one ``matmul`` per layer and direction, then one small step per time
  step), with their gradients, which every backend can take; a graph run as Dynamo captured it runs
  the module's own kernel (:func:`_autograd` picks);
- while Dynamo traces an unsupported call (a long sequence), the class's own ``forward`` is traced: its
  graph holds a ``torch.lstm``-like call, which the capture frontend runs as Dynamo captured it, eagerly,
  and explain names (``frontends/dynamo.py``); a call on a ``PackedSequence`` (batch sizes that are data)
  is not traced at all: a break at the call, as Dynamo alone gives;
- outside Dynamo the class's own ``forward`` runs (cuDNN and all), so eager results are untouched.

:mod:`.switches` turns ``allow_rnn`` on so that Dynamo reaches this forward; a ``torch.lstm`` call that
still lands in a graph (an RNN that is not a submodule) makes the capture frontend run that graph as
Dynamo captured it (``frontends/dynamo.py``).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from . import runtime as rt

#: time steps x layers x directions written out at most: each step is a dozen ops that AOTAutograd
#: traces; a longer call is an unsupported one (above). ``torch._higher_order_ops.scan`` traces
#: one step whatever the length, but its fixed cost (about 2 s) is larger at the lengths seen here.
MAX_STEPS = 128
_KINDS = (nn.LSTM, nn.GRU, nn.RNN)


def install(m: nn.Module, where: str, notes: list[int]) -> None:
    """Bind the written-out :func:`forward` to ``m`` if its class is exactly nn.LSTM / nn.GRU / nn.RNN."""
    if type(m) not in _KINDS:
        return
    bound = vars(m).get("forward")
    if bound is not None:  # the user's own, or ours from an earlier mend (its note is reported again)
        if getattr(bound, "__func__", None) is forward:
            notes.append(vars(m)["_torchmux_rnn_note"])
        return
    key = rt.note(f"{where}: {type(m).__name__} -> its recurrence in tensor ops")
    notes.append(key)
    object.__setattr__(m, "_torchmux_rnn_note", key)  # read back by forward when traced
    object.__setattr__(m, "forward", types.MethodType(forward, m))


def forward(self: nn.RNNBase, input: Any, hx: Any = None) -> Any:
    """The module's forward: written out while Dynamo traces a supported call, the class's otherwise."""
    if not torch.compiler.is_compiling():
        return type(self).forward(self, input, hx)
    if isinstance(input, nn.utils.rnn.PackedSequence):
        return _packed(self, input, hx)
    if not _supported(self, input):  # traced as torch.lstm/gru: frontends/dynamo.py runs that graph eagerly
        return type(self).forward(self, input, hx)
    rt.fired(self._torchmux_rnn_note)  # type: ignore[arg-type]  # an int set by install()
    lstm = isinstance(self, nn.LSTM)
    states = [] if hx is None else list(hx) if lstm else [hx]
    params = [getattr(self, name) for name in self._flat_weights_names]
    kind = "lstm" if lstm else "gru" if isinstance(self, nn.GRU) else self.nonlinearity
    dirs = 2 if self.bidirectional else 1
    out = _OP(input, states, params, kind, self.num_layers, dirs, self.batch_first, self.bias)
    return (out[0], (out[1], out[2])) if lstm else (out[0], out[1])


@torch.compiler.disable
def _packed(self: nn.RNNBase, input: Any, hx: Any) -> Any:
    """A call on a ``PackedSequence``, run as the class runs it and never traced: its recurrence reads the
    batch sizes, which are data (Dynamo, tracing the class's forward, meets that deep inside ``_VF.lstm``
    and gives up after tracing the way there, which cost DeepSpeech's ``BatchRNN`` twice Dynamo's capture
    time; Dynamo left to itself refuses the module at once). A break at the call, as under Dynamo."""
    return type(self).forward(self, input, hx)


forward._torchmux_mended_from = nn.RNNBase.forward  # type: ignore[attr-defined]  # mended() restores it


def _supported(m: nn.RNNBase, input: Any) -> bool:
    return (
        isinstance(input, torch.Tensor)
        and input.dim() in (2, 3)
        and m.proj_size == 0
        and not (m.training and m.dropout > 0)
        and _steps(m, input) <= MAX_STEPS
    )


def _steps(m: nn.RNNBase, input: torch.Tensor) -> int:
    length = input.shape[1 if m.batch_first and input.dim() == 3 else 0]
    return int(length) * m.num_layers * (2 if m.bidirectional else 1)


def _unrolled(
    input: torch.Tensor,
    states: list[torch.Tensor],
    params: list[torch.Tensor],
    kind: str,
    num_layers: int,
    dirs: int,
    batch_first: bool,
    bias: bool,
) -> list[torch.Tensor]:
    """The recurrence in plain tensor ops: [output, h_n] ([output, h_n, c_n] for an LSTM).

    The body of :data:`_OP`: ``params`` in the module's ``_flat_weights_names`` order, ``states`` the
    module's ``hx`` as a list ([] for None)."""
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(1)  # (L, N, H) from here on
    if batched and batch_first:
        x = x.transpose(0, 1)
    lstm = kind == "lstm"
    per = 4 if bias else 2  # w_ih, w_hh(, b_ih, b_hh) per layer and direction
    c0: torch.Tensor | None
    if not states:
        zeros = x.new_zeros(num_layers * dirs, x.shape[1], params[1].shape[1])
        h0, c0 = zeros, zeros
    else:
        h0 = states[0] if batched else states[0].unsqueeze(1)
        c0 = None if not lstm else states[1] if batched else states[1].unsqueeze(1)
    h_out, c_out = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            weights = params[i * per : (i + 1) * per]
            h, c, ys = _direction(kind, x, d, weights, h0[i], c0[i] if c0 is not None else None)
            outs.append(ys)
            h_out.append(h)
            c_out.append(c)
        x = outs[0] if dirs == 1 else torch.cat(outs, dim=2)
    out, h_n = x, torch.stack(h_out)
    if batched and batch_first:
        out = out.transpose(0, 1)
    if not batched:
        out, h_n = out.squeeze(1), h_n.squeeze(1)
    if not lstm:
        return [out, h_n]
    c_n = torch.stack([c for c in c_out if c is not None])
    return [out, h_n, c_n if batched else c_n.squeeze(1)]


def _direction(
    kind: str, x: torch.Tensor, d: int, weights: list[torch.Tensor], h: torch.Tensor, c: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One layer, one direction over the whole sequence: final h (and c), and the outputs (L, N, H)."""
    w_ih, w_hh = weights[0], weights[1]
    b_ih, b_hh = (weights[2], weights[3]) if len(weights) == 4 else (None, None)
    projected = torch.matmul(x, w_ih.t())  # every step's input projection at once
    if b_ih is not None:
        projected = projected + b_ih
    fold = b_hh is not None and kind != "gru"  # gates = gi + gh: b_hh joins the projection (not GRU's r * h_n)
    if b_hh is not None and fold:
        projected = projected + b_hh
    w_hh_t = w_hh.t()
    steps = range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])
    ys: list[torch.Tensor] = []
    for t in steps:  # as few ops a step as the equations allow: each costs tracing time
        if fold or b_hh is None:
            h, c = _cell(kind, projected[t], torch.matmul(h, w_hh_t), h, c)
        else:
            h, c = _cell(kind, projected[t], torch.addmm(b_hh, h, w_hh_t), h, c)
        ys.append(h)
    if d:
        ys.reverse()
    return h, c, torch.stack(ys)


def _cell(
    kind: str, gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One time step: the gate equations of the nn.LSTM / nn.GRU / nn.RNN documentation."""
    if kind == "lstm":
        i, f, g, o = (gi + gh).chunk(4, dim=-1)
        assert c is not None  # an LSTM carries its cell state
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if kind == "gru":
        i_r, i_z, i_n = gi.chunk(3, dim=-1)
        h_r, h_z, h_n = gh.chunk(3, dim=-1)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h, None
    pre = gi + gh
    return (torch.tanh(pre) if kind == "tanh" else torch.relu(pre)), None


def _real(
    input: torch.Tensor,
    states: list[torch.Tensor],
    params: list[torch.Tensor],
    kind: str,
    num_layers: int,
    dirs: int,
    batch_first: bool,
    bias: bool,
) -> list[torch.Tensor]:
    """The module's own kernel (``torch._VF.lstm`` and kin, cuDNN on a GPU): what eager runs, bit for bit.

    The op's kernel on real tensors that need no gradient (a graph run as Dynamo captured it)."""
    batched, batch_dim = input.dim() == 3, 0 if batch_first else 1
    x = input if batched else input.unsqueeze(batch_dim)
    hidden = params[1].shape[1]
    if states:
        hs = [s if batched else s.unsqueeze(1) for s in states]
    else:
        zeros = x.new_zeros(num_layers * dirs, x.shape[batch_dim], hidden)
        hs = [zeros, zeros] if kind == "lstm" else [zeros]
    args = (params, bias, num_layers, 0.0, False, dirs == 2, batch_first)
    if kind == "lstm":
        out = list(torch._VF.lstm(x, hs, *args))
    else:
        run = {"gru": torch._VF.gru, "tanh": torch._VF.rnn_tanh, "relu": torch._VF.rnn_relu}[kind]
        out = list(run(x, hs[0], *args))
    return out if batched else [out[0].squeeze(batch_dim)] + [s.squeeze(1) for s in out[1:]]


def _shapes(
    input: torch.Tensor,
    states: list[torch.Tensor],
    params: list[torch.Tensor],
    kind: str,
    num_layers: int,
    dirs: int,
    batch_first: bool,
    bias: bool,
) -> list[torch.Tensor]:
    """The op's fake kernel: outputs of the right shapes, no recurrence (all Dynamo's trace needs)."""
    hidden = params[1].shape[1]
    out = input.new_empty(*input.shape[:-1], dirs * hidden)
    batch = () if input.dim() == 2 else (input.shape[0 if batch_first else 1],)
    state = input.new_empty(num_layers * dirs, *batch, hidden)
    return [out, state, state.clone()] if kind == "lstm" else [out, state]


def _autograd(*args: Any) -> list[torch.Tensor]:
    """The op's Autograd kernel: which of the three kernels above a call gets.

    - AOTAutograd tracing (a proxy or functional mode is active), or a call whose result needs a gradient:
      :func:`_unrolled`, so the graph holds plain differentiable ops that every backend can take;
    - Dynamo's shape pass (fake tensors, no tracing mode): :func:`_shapes`, one op however long the
      sequence (writing out the steps there cost ~40 ms per 10 steps of capture); the outputs require
      grad where the written-out ops' would;
    - real tensors needing no gradient: :func:`_real`."""
    tracing = any(
        torch._C._get_dispatch_mode(key) is not None
        for key in (torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FUNCTIONAL)
    )
    tensors = [args[0], *args[1], *args[2]]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    fake = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    if tracing or (grad and not fake):
        return _unrolled(*args)
    with torch._C._AutoDispatchBelowAutograd():
        out = _OP(*args)
    return [o.requires_grad_() for o in out] if grad else out


# The recurrence as one operator (see :func:`_autograd` for which kernel runs when): Dynamo records one
# call and fake-runs it for shapes only, AOTAutograd decomposes it into the plain ops of :func:`_unrolled`,
# with their gradients, before any backend sees the graph, and a graph run as captured runs the module's
# own kernel.
_LIB = torch.library.Library("torchmux_mend", "FRAGMENT")
if not hasattr(torch.ops.torchmux_mend, "rnn"):
    _LIB.define(
        "rnn(Tensor input, Tensor[] states, Tensor[] params, str kind, int num_layers, int dirs,"
        " bool batch_first, bool bias) -> Tensor[]"
    )
    _LIB.impl("rnn", _real, "CompositeExplicitAutograd")
    _LIB.impl("rnn", _autograd, "Autograd")
    torch.library.register_fake("torchmux_mend::rnn", _shapes, lib=_LIB)
_OP = torch.ops.torchmux_mend.rnn.default
