"""What auto builds (autotune/screen.py): a backend that needs tuning on the device (TVM on the CPU) is
not built in the default mode, unless this machine saw it come close on a graph of the same kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchmux.autotune import screen
from torchmux.autotune.runner import GraphRunner
from torchmux.core.config import resolve
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace


def _ir():
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2.0) + 1.0

    x = torch.randn(4, 8)
    return trace(f, [x]), x


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    return tmp_path


def _tvm() -> None:
    if "tvm" not in get_registry().names or not get_registry().availability("tvm").ok:
        pytest.skip("tvm is not available")


def test_tvm_is_not_built_on_the_cpu_in_default_mode(own_cache: Path) -> None:
    _tvm()
    ir, x = _ir()
    runner = GraphRunner(ir, resolve(["eager", "tvm"], None, None))
    torch.testing.assert_close(runner(x)[0], torch.tanh(x * 2.0) + 1.0)
    (decision,) = runner.placements()
    tvm = next(m for m in decision.measurements if m.backend == "tvm")
    assert not tvm.ok and tvm.placement is None and "not built: needs tuning on cpu" in tvm.reason
    assert decision.backend == "eager"


def test_a_remembered_close_result_brings_it_back(own_cache: Path) -> None:
    _tvm()
    ir, x = _ir()
    folder = own_cache / "screen"
    folder.mkdir(parents=True)
    (folder / "tvm.json").write_text(json.dumps({screen.graph_kind(ir, "cpu"): 1.2}))
    runner = GraphRunner(ir, resolve(["eager", "tvm"], None, None))
    runner(x)
    (decision,) = runner.placements()
    tvm = next(m for m in decision.measurements if m.backend == "tvm")
    assert tvm.ok and tvm.placement is not None  # built and measured
    record = json.loads((folder / "tvm.json").read_text())
    assert record[screen.graph_kind(ir, "cpu")] <= 1.2  # the best ratio seen is kept


def test_max_autotune_builds_everything_and_other_kinds_are_not_brought_back(own_cache: Path) -> None:
    ir, _ = _ir()
    tvm_like = type("T", (), {"name": "tvm", "needs_tuning": ("cpu",)})()
    assert screen.skipped(ir, [tvm_like], "cpu", "max-autotune") == {}
    assert "tvm" in screen.skipped(ir, [tvm_like], "cpu", None)
    assert screen.skipped(ir, [tvm_like], "cuda", None) == {}  # needs tuning on the CPU only
    other = trace(torch.relu, [torch.randn(2)])
    folder = own_cache / "screen"
    folder.mkdir(parents=True)
    (folder / "tvm.json").write_text(json.dumps({screen.graph_kind(other, "cpu"): 1.0}))
    assert "tvm" in screen.skipped(ir, [tvm_like], "cpu", None)  # a close result on other ops does not count
