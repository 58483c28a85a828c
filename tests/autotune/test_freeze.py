"""Frozen inference (autotune/freeze.py): weights reach the backends as constants, and a weight changed
after compiling is noticed before the next call, on every backend that freezes.

Each backend test compiles one small model (Linear + BatchNorm + Linear, eval, no_grad) once and then
changes its weights every way a program does, checking each answer against eager: an in-place add
under no_grad, an optimizer step, load_state_dict, a new Parameter object, a buffer's ``copy_``. The first three
changes are refrozen (the winner rebuilt on the new weights); the changes after MAX_REFREEZES run the
graph unfrozen.
"""

from __future__ import annotations

import glob
import os
import warnings

import pytest
import torch

import torchmux
from torchmux.autotune.freeze import MAX_REFREEZES, can_freeze, freeze
from torchmux.core.trace import trace


def _model(width: int = 32) -> torch.nn.Module:
    """Dynamo reuses a graph for every Sequential of the same shapes: a test that needs a graph of its
    own passes a width no other test uses."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU(), torch.nn.Linear(width, 8)
    ).eval()


def _changes(model: torch.nn.Module) -> list:
    """Every way a program changes weights in place, one after the other (more than MAX_REFREEZES)."""

    def add_under_no_grad() -> None:
        with torch.no_grad():
            model[0].weight.add_(1.0)

    def optimizer_step() -> None:
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()

    def load_state_dict() -> None:
        model.load_state_dict({k: v * 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()})

    def new_parameter() -> None:
        model[3].weight = torch.nn.Parameter(torch.randn(8, 32))

    def buffer_copy() -> None:
        with torch.no_grad():
            model[1].running_mean.copy_(torch.randn(32))

    changes = [add_under_no_grad, optimizer_step, load_state_dict, new_parameter, buffer_copy]
    assert len(changes) > MAX_REFREEZES
    return changes


def _check_every_change(backend: str) -> None:
    model, x = _model(), torch.randn(4, 16)
    compiled = torchmux.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)  # the backend must really run it
        torch.testing.assert_close(compiled(x), model(x))
        for change in _changes(model):
            change()
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), model(x), msg=f"{backend}: stale after {change.__name__}")


@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "inductor", "tvm"])
def test_every_in_place_change_is_noticed(backend: str) -> None:
    if backend not in [b.name for b in _available()]:
        pytest.skip(f"{backend} is not available here")
    _check_every_change(backend)


def test_every_in_place_change_is_noticed_triton() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it) or CUDA")
    pytest.importorskip("triton")
    _check_every_change("triton")


def _available() -> list:
    from torchmux.core.registry import get_registry

    return get_registry().available()


def test_onnx_model_gets_weights_as_initializers_and_a_key_of_their_own() -> None:
    model, x = _model(width=24), torch.randn(4, 16)
    with torch.no_grad():
        torchmux.compile(model, backend="onnxruntime")(x)
    import onnx

    newest = max(
        glob.glob(os.path.join(os.environ["TORCHMUX_CACHE_DIR"], "onnxruntime", "*", "model.onnx")),
        key=os.path.getmtime,
    )
    proto = onnx.load(newest)
    assert [i.name for i in proto.graph.input] and len(proto.graph.input) == 1  # only x is an input
    assert len(proto.graph.initializer) >= 4  # two weights, two biases (batch norm may be folded in)


def test_frozen_twin_keeps_user_inputs_and_its_fingerprint_names_the_weights() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t() + b)

    x, w, b = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)
    ir = trace(fn, (x, w, b))
    ir.input_kinds = ("input", "param", "param")
    assert can_freeze(ir)
    frozen = freeze(ir, [x, w, b])
    assert len(frozen.placeholders) == 1 and frozen.input_kinds == ("input",)
    assert len([n for n in frozen.graph.nodes if n.op == "get_attr"]) == 2
    torch.testing.assert_close(frozen.run_reference(x), ir.run_reference(x, w, b))
    assert freeze(ir, [x, w, b]).fingerprint() == frozen.fingerprint()  # stable
    assert freeze(ir, [x, w + 1, b]).fingerprint() != frozen.fingerprint()  # other weights, other artifacts
    ir.phase = "forward"
    assert not can_freeze(ir)  # training graphs keep weights as inputs


def test_freeze_false_keeps_weights_as_inputs_and_sees_writes_through_data() -> None:
    """Writes through ``.data`` bypass the version counter: with freezing off every write is seen."""
    model, x = _model(width=40), torch.randn(4, 16)
    compiled = torchmux.compile(model, backend="onnxruntime", options={"freeze": False})
    with torch.no_grad():
        compiled(x)
        model[0].weight.data.copy_(torch.randn(40, 16))
        torch.testing.assert_close(compiled(x), model(x))
        model[3].weight.data = torch.randn(8, 40)
        torch.testing.assert_close(compiled(x), model(x))


def test_freeze_option_must_be_a_bool() -> None:
    with pytest.raises(torchmux.BadArgumentError, match="freeze"):
        torchmux.compile(_model(), options={"freeze": "yes"})
