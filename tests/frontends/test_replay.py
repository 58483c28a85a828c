"""frontends/replay.py: a compiled module's cache hits run Dynamo's code directly, and only when Dynamo
itself would run that code. Every test compares with eager after changing what the answer depends on."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import torchmux
from torchmux.frontends.replay import Replay


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test starts from Dynamo's empty caches (the classes here are compiled in several tests)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, x, shift=0.5):
        return self.fc(x).relu() * self.scale + shift


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        n = int(y.sum().item() > 0)  # a graph break (data-dependent Python int)
        return y * (n + 1)


def _replay_of(compiled) -> Replay:
    cells = [c.cell_contents for c in compiled.forward.__closure__ or ()]
    (replay,) = [c for c in cells if isinstance(c, Replay)]
    return replay


def _compile(model: nn.Module, **options) -> nn.Module:
    return torchmux.compile(model, backend="eager", options={"verify": "off", **options})


def _warmed() -> tuple[nn.Module, torch.Tensor, nn.Module, Replay]:
    """A Scaled model compiled and called twice under no_grad (the second call a replayed hit)."""
    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(4, 8)
    compiled = _compile(model)
    with torch.no_grad():
        compiled(x), compiled(x)
    return model, x, compiled, _replay_of(compiled)


def test_a_cache_hit_replays_and_answers_as_dynamo_does() -> None:
    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(4, 8)
    compiled = _compile(model)
    with torch.no_grad():
        first = compiled(x)  # Dynamo captures
        replay = _replay_of(compiled)
        second = compiled(x)
        assert replay.hits == 1
        assert torch.equal(first, second) and torch.equal(second, model(x))
        assert torch.equal(compiled(x, 1.5), model(x, 1.5))  # a keyword or default changes: Dynamo's path
        assert torch.equal(compiled(torch.randn(2, 8) * 0), model(torch.zeros(2, 8)))  # a new shape
    off = _compile(model, replay=False)
    with torch.no_grad():
        off(x), off(x)
    assert not any(isinstance(c.cell_contents, Replay) for c in off.forward.__closure__ or ())


def test_what_the_answer_depends_on_changes_and_replay_follows_dynamos_guards() -> None:
    model, x, compiled, replay = _warmed()
    hits = replay.hits
    model.scale = 3.0  # a Python attribute the trace read: Dynamo's guard fails, it traces again
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    with torch.no_grad():
        model.fc.weight.add_(1.0)  # in place: the graph's weights are read again
        assert torch.equal(compiled(x), model(x))
    model.fc.weight = nn.Parameter(torch.randn(8, 8))  # a new parameter object
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    out = compiled(x)  # grad mode on: another entry (the first ones were traced under no_grad)
    assert out.requires_grad and torch.allclose(out, model(x))
    out.sum().backward()
    assert model.fc.weight.grad is not None
    assert replay.hits > hits  # and later hits replayed again


def test_hooks_other_stances_and_an_enclosing_trace_go_through_dynamo() -> None:
    model, x, compiled, replay = _warmed()
    hits = replay.hits
    seen = []
    handle = model.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    assert len(seen) == 2 and replay.hits == hits  # the hook ran for the compiled call too
    handle.remove()
    with torch.compiler.set_stance("force_eager"), torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    assert replay.hits == hits

    outer = torch.compile(lambda t: compiled(t) + 1, backend="eager")
    with torch.no_grad():
        assert torch.equal(outer(x), model(x) + 1)
    assert replay.hits == hits


def test_a_forward_with_a_break_or_replaced_is_not_replayed() -> None:
    torch.manual_seed(0)
    model, x = Broken().eval(), torch.randn(4, 8)
    compiled = _compile(model, mend=False)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(compiled(x), model(x))
    assert _replay_of(compiled).hits == 0  # the code after the break is a resume function: Dynamo runs it

    scaled = Scaled().eval()
    compiled = _compile(scaled)
    with torch.no_grad():
        compiled(x), compiled(x)
        replay = _replay_of(compiled)
        hits = replay.hits
        scaled.forward = lambda t, shift=0.5: t * 10  # the user reassigns forward
        assert torch.equal(compiled(x), x * 10)
    assert replay.hits == hits


def _either(p, if_true, if_false):
    if p:  # a graph break in a helper Dynamo inlines, after the caller made two closures
        return if_true()
    return if_false()


class Closures(nn.Module):
    def forward(self, x):
        return _either(x.sum() > 0, lambda: x * 2, lambda: x - 1) + 1


def test_a_transformed_code_holding_a_dict_is_looked_up_without_hashing_it() -> None:
    """Dynamo's code for a frame that breaks after making closures holds their globals (a dict) among its
    constants, and a code object hashes its constants: the replay's lookup raised ``TypeError:
    unhashable type: 'dict'`` out of the user's second call."""
    model = Closures()
    compiled = _compile(model, mend=False)
    for sign in (1, -1, 1, -1, 1, -1):
        x = sign * torch.ones(3)
        assert torch.equal(compiled(x), model(x))


def test_an_entry_another_backend_compiled_is_never_replayed() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    a, b = Scaled().eval(), Scaled().eval()
    plain = torch.compile(a, backend="eager")  # the same forward's code, cached by another backend
    with torch.no_grad():
        plain(x)
        compiled = _compile(b)
        compiled(x), compiled(x)
        replay = _replay_of(compiled)
        assert replay.hits == 1
        assert torch.equal(compiled(x), b(x)) and torch.equal(plain(x), a(x))
