"""explain never says nothing: what Dynamo did not capture is reported with a reason and the user's file:line."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

import torchmux
from torchmux.api.explain import compile_recorded, report

HERE = __file__


class EarlyStopLayers(nn.Module):
    """A ``for`` over layers with ``if <tensor>: break``: Dynamo gives up on the whole frame."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            if x.abs().max() > 100:  # the line explain must name
                break
        return x


class AttrDict(dict):
    __getattr__ = dict.__getitem__


def scale_by_config(x, cfg=AttrDict(scale=2.0)):  # noqa: B008 -- the research-code pattern under test
    return x * cfg.scale


def _explain(model, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchmux.explain(model, *args, backend="eager", mend=False)


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(open(HERE).read().splitlines(), 1) if text in line)


def test_a_frame_dynamo_skips_is_reported_at_the_users_line() -> None:
    rep = _explain(EarlyStopLayers(), torch.randn(2, 8))
    assert rep.graph_count == 0
    [skip] = rep.not_captured
    assert (skip.filename, skip.lineno) == (HERE, _line_of("the line explain must name"))
    assert "skipped" in skip.reason and "Data-dependent branching" in skip.reason
    assert "Not captured" in str(rep) and f"{HERE}:{skip.lineno}" in str(rep)


def test_an_object_dynamo_cannot_trace_is_reported_with_its_reason() -> None:
    rep = _explain(scale_by_config, torch.randn(3))
    assert rep.graph_count == 0
    [skip] = rep.not_captured
    assert skip.filename == HERE and "__getattr__" in skip.reason


def test_a_recompile_limit_reached_is_reported() -> None:
    def scale(x, k):
        return x * k

    torch._dynamo.reset()
    try:
        compiled, recorder = compile_recorded(scale, "eager", mend=False)
        limit = torch._dynamo.config.recompile_limit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for k in range(limit + 2):
                torch.testing.assert_close(compiled(torch.ones(2), float(k)), torch.full((2,), float(k)))
        rep = report(recorder)
    finally:
        torch._dynamo.reset()
    assert rep.graph_count == limit
    assert any("recompile limit" in r.reason and r.filename == HERE for r in rep.not_captured), rep.not_captured


def test_a_program_dynamo_captures_whole_reports_nothing_missing() -> None:
    rep = _explain(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4))
    assert (rep.graph_count, rep.not_captured) == (1, [])
