"""Capture for ``torchmux.export`` (``frontends/export.py``): what ``torch.export`` takes, taken as it is;
a program only strict mode takes, taken strict; a data-dependent ``if`` that only the mend pass's
rewrite lets export take, taken with its rewrite (``torch.where``, ``torch.cond``, a check kept as a
runtime assertion); a program that writes its input in place, taken with the user's outputs; a program
nothing takes, refused with the user's line.

Each captured program is run and compared with the eager module, on inputs that take each branch.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

import torchmux
from torchmux.frontends.export import ExportRefused, capture


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


class SizeFromData(nn.Module):
    """``int(t.max())`` as a size: non-strict export needs a Python int there; strict keeps it symbolic."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = int(n.max())
        return torch.zeros(k, 3) + x.sum()


class Branch(nn.Module):
    """An ``if`` on a tensor's value: both export modes refuse it; the mend pass makes it a select."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            z = y * 2
        else:
            z = y - 1
        return z


class RandomBranch(nn.Module):
    """Only one side may run (it draws random numbers): the mend pass makes it ``torch.cond``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:
            return x.exp()
        return x + torch.rand_like(x)


class Unexportable(nn.Module):
    """The branches give different shapes: neither ``torch.where`` nor ``torch.cond`` can join them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x[:2]
        return x


def test_a_program_torch_export_takes_is_taken_as_it_is() -> None:
    model, x = Plain().eval(), torch.randn(2, 4)
    before = model.forward
    captured = capture(model, (x,))
    assert (captured.strict, captured.mended) == (False, False)
    torch.testing.assert_close(captured.program.module()(x), model(x))
    assert list(captured.ir.input_kinds) == ["param", "param", "input"]
    assert model.forward == before  # the user's module is left as it was


def test_a_program_only_strict_export_takes_is_taken_strict() -> None:
    model, x, n = SizeFromData().eval(), torch.randn(5, 3), torch.tensor([2, 4])
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(model, (x, n), strict=False)
    captured = capture(model, (x, n))
    assert (captured.strict, captured.mended) == (True, False)
    program = captured.program.module()
    torch.testing.assert_close(program(x, n), model(x, n))
    other = torch.tensor([1, 6])  # another size from the data: the program is not specialized to 4
    torch.testing.assert_close(program(x, other), model(x, other))


def test_a_data_dependent_if_is_taken_after_the_mend_pass_and_answers_both_ways() -> None:
    model = Branch().eval()
    with torch.no_grad():  # y = x: the test's side is the sign of the input's sum
        model.fc.weight.copy_(torch.eye(4))
        model.fc.bias.zero_()
    x = torch.randn(3, 4)
    for strict in (False, True):
        with pytest.raises(Exception, match="[Dd]ata-dependent"):
            torch.export.export(model, (x,), strict=strict)
    captured = capture(model, (x,))
    assert captured.mended
    assert not model.__dict__.get("forward")  # the rewrite was installed for the capture only
    program = captured.program.module()
    ops = {n.target for n in captured.program.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.where.self in ops
    up, down = torch.full((3, 4), 5.0), torch.full((3, 4), -5.0)  # inputs on both sides of the test
    sides = {bool(model.fc(t).sum() > 0) for t in (up, down, x)}
    assert sides == {True, False}
    for t in (up, down, x):
        torch.testing.assert_close(program(t), model(t))


def test_a_branch_that_only_one_side_may_run_becomes_torch_cond() -> None:
    model, x = RandomBranch().eval(), torch.rand(2, 3)
    captured = capture(model, (x,))
    assert captured.mended
    ops = {n.target for n in captured.program.graph.nodes if n.op == "call_function"}
    assert torch.ops.higher_order.cond in ops
    program = captured.program.module()
    torch.testing.assert_close(program(x), x.exp())  # mean > 0: the deterministic side
    low = -torch.rand(2, 3) - 2  # mean < 0: the random side, x + U[0, 1)
    out = program(low)
    assert bool(((out - low) >= 0).all() and ((out - low) < 1).all())


def test_a_program_nothing_takes_is_refused_with_the_users_line() -> None:
    model, x = Unexportable().eval(), torch.randn(3, 4)
    with pytest.raises(ExportRefused) as refused:  # torchmux.export: the capture, plus explain's breaks
        torchmux.export(model, (x,), backend="eager")
    message = str(refused.value)
    lines, first = inspect.getsourcelines(Unexportable.forward)
    line = first + next(i for i, text in enumerate(lines) if "if x.sum() > 0" in text)
    assert f"{__file__}:{line}" in message
    for how in ("non-strict:", "strict:", "after the mend pass"):
        assert how in message
    assert "torch.cond" in message  # what to do about it


class WritesItsInput(nn.Module):
    """``nn.ReLU(inplace=True)`` first in a residual block writes the caller's tensor (pre-activation ResNets)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def test_a_program_that_writes_its_input_is_taken_and_the_ir_returns_the_users_outputs() -> None:
    model, x = WritesItsInput().eval(), torch.randn(3, 4)
    with pytest.warns(UserWarning, match="writes its input"):
        captured = capture(model, (x.clone(),))
    outputs = next(n for n in captured.ir.gm.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == 1  # the user's output only, not the new value of x
    kept = x.clone()
    expected = model(x.clone())
    got = captured.ir.gm(*[p.detach() for p in captured.weights], kept)
    torch.testing.assert_close(got[0], expected)
    torch.testing.assert_close(kept, x)  # the IR's graph leaves the caller's tensor as it was


class Checked(nn.Module):
    """A check on the data: eager raises ValueError on a negative input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x < 0).any():
            raise ValueError("negative input")
        return x.sqrt()


def test_a_check_on_the_data_becomes_a_runtime_assertion_in_the_program() -> None:
    model, x = Checked().eval(), torch.rand(2, 3)
    for strict in (False, True):
        with pytest.raises(Exception, match="[Dd]ata-dependent"):
            torch.export.export(model, (x,), strict=strict)
    captured = capture(model, (x,))
    assert captured.mended and not captured.strict
    program = captured.program.module()
    torch.testing.assert_close(program(x), x.sqrt())
    with pytest.raises(RuntimeError, match="[Rr]untime assertion"):  # torch._check's assertion, kept by export
        program(-torch.ones(2, 3))


class ReadsWeightData(nn.Module):
    """``self.weight.data`` in the forward: strict export (torch 2.13) gives a program holding a fake tensor,
    whose decomposition crashed the process."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.data
        return x @ (w / w.norm(dim=1, keepdim=True))


def test_a_program_export_gives_with_a_fake_tensor_inside_is_refused_not_run_and_the_mend_pass_takes_it() -> None:
    """Without the mend pass, the program strict export returns (a fake tensor inside) is refused, never
    run; with it, ``self.weight.data`` is exported as ``detach()`` and the program answers as eager does."""
    model, x = ReadsWeightData().eval(), torch.randn(2, 4)
    with pytest.raises(ExportRefused, match="fake tensor"):
        capture(model, (x,), mend=False)
    captured = capture(model, (x,))
    assert captured.mended
    torch.testing.assert_close(captured.program.module()(x), model(x))


class FocalLoss(nn.Module):
    """A focal loss written before PyTorch 0.4 (ParityBench's eighth sample: VSainteuf_pytorch_psetae):
    ``Variable(logpt.data.exp())``. Non-strict export gives a tensor read through ``.data`` no place in the
    graph and refuses the program (a fake tensor among its constants); strict export refuses it too."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logpt = torch.log_softmax(x, dim=1).gather(1, target.view(-1, 1)).view(-1)
        pt = torch.autograd.Variable(logpt.data.exp())
        return (-((1 - pt) ** 2) * logpt).mean() + target.data.float().mean()


def test_a_data_read_is_exported_as_detach_after_the_mend_pass_and_compile_keeps_it() -> None:
    """Mended for export (inference only), ``t.data`` is ``t.detach()`` while export traces: the program is
    taken and answers as eager does. ``compile()`` never gets this rewrite (``.data`` and ``detach()`` differ
    under autograd): its mended forward still reads ``.data``."""
    from torchmux.frontends.mend import mended, source_of

    model, x, target = FocalLoss().eval(), torch.randn(8, 4), torch.randint(0, 4, (8,))
    for strict in (False, True):
        with pytest.raises(Exception):  # noqa: B017 -- each mode's own refusal, whatever its type
            torch.export.export(model, (x, target), strict=strict)
    captured = capture(model, (x, target))
    assert captured.mended
    torch.testing.assert_close(captured.program.module()(x, target), model(x, target))
    other = torch.randint(0, 4, (8,))
    torch.testing.assert_close(captured.program.module()(-x, other), model(-x, other))
    with mended(model) as (target_model, _):  # as compile() mends it
        assert ".data" in source_of(target_model.forward) or not source_of(target_model.forward)
        assert "data_of" not in source_of(target_model.forward)


class LabelSmoothing(nn.Module):
    """Label smoothing as NVIDIA Merlin's ``LabelSmoothCrossEntropyLoss`` writes it (ParityBench's eighth
    sample): the one-hot targets are built in a ``staticmethod`` called as ``Class.method(...)``, reading
    ``targets.data``."""

    @staticmethod
    def _smooth_one_hot(targets: torch.Tensor, n_classes: int, smoothing: float = 0.0) -> torch.Tensor:
        with torch.no_grad():
            targets = (
                torch.empty(size=(targets.size(0), n_classes), device=targets.device)
                .fill_(smoothing / (n_classes - 1))
                .scatter_(1, targets.data.unsqueeze(1), 1.0 - smoothing)
            )
        return targets

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = LabelSmoothing._smooth_one_hot(targets, inputs.size(-1), 0.1)
        return -(targets * torch.log_softmax(inputs, -1)).sum(-1).mean()


def test_a_data_read_in_a_static_method_called_by_its_class_is_exported() -> None:
    """The mend pass follows ``Class.static_method(...)`` as it follows a global function: the ``.data``
    read inside it is exported as ``detach()``, which torch.export alone refuses."""
    model, x, target = LabelSmoothing().eval(), torch.randn(8, 5), torch.randint(0, 5, (8,))
    with pytest.raises(Exception):  # noqa: B017 -- non-strict export's own refusal (a fake tensor left)
        torch.export.export(model, (x, target), strict=False)
    captured = capture(model, (x, target))
    assert captured.mended
    other = torch.randint(0, 5, (8,))
    for args in ((x, target), (-x, other)):
        torch.testing.assert_close(captured.program.module()(*args), model(*args))
