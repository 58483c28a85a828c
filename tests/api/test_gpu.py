"""torchmux's user paths on a CUDA GPU: ``compile`` under auto and with each CUDA backend named, and
``export -> save -> load`` with AOTInductor and under auto. Marked ``gpu``: they skip without CUDA and run
on the GPU machine (``pytest -m gpu``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import torchmux
from torchmux.bench import zoo

pytestmark = pytest.mark.gpu


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64)).cuda().eval()
    return model, torch.randn(8, 64, device="cuda")


def _fallbacks(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning)]


@pytest.mark.parametrize("backend", ["auto", "triton", "cudagraphs", "inductor"])
def test_compile_on_cuda_matches_eager_at_two_batch_sizes(backend: str) -> None:
    model, x = _mlp()
    compiled = torchmux.compile(model, backend=backend)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (8, 8, 8, 3, 3, 8):
            xb = x[:batch].clone() if batch <= 8 else x
            before = xb.clone()
            out = compiled(xb)
            assert out.is_cuda
            torch.testing.assert_close(out, model(xb), rtol=2e-3, atol=2e-3)
            assert torch.equal(xb, before)  # the user's input is never written
    assert _fallbacks(caught) == [], _fallbacks(caught)


def test_compile_auto_on_cuda_with_gradients() -> None:
    model, x = _mlp()
    model.train()
    compiled = torchmux.compile(model, backend="auto")
    for _ in range(3):
        model.zero_grad()
        compiled(x).sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).sum().backward()
        for g, want in zip(got, (p.grad for p in model.parameters())):
            torch.testing.assert_close(g, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", ["inductor", "eager", "auto"])
def test_export_save_load_on_cuda(backend: str, tmp_path) -> None:
    model, x = _mlp()
    exported = torchmux.export(model, (x,), backend=backend, dynamic_shapes=({0: torch.export.Dim("batch", max=32)},))
    rows = {c["backend"]: c for c in exported.plan["candidates"]}
    # AOTInductor's own loader died on every CUDA package on the H200 (torch 2.11, 2026-11-28): built in
    # another process, cold or warmed, weights inside or out (bench/scripts/aoti_probe.py); the export
    # then falls back, and what it ships must still answer right
    loader_died = backend == "inductor" and "_load_aoti" in rows["inductor"]["reason"]
    assert backend == "auto" or exported.backend == backend or loader_died, rows[backend]["reason"]  # it ran
    path = exported.save(tmp_path / f"mlp-{backend}.tmux")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = torchmux.load(path)
        with torch.no_grad():
            for xb in (x, torch.randn(5, 64, device="cuda")):
                out = loaded(xb)
                assert out.is_cuda
                torch.testing.assert_close(out, model(xb), rtol=2e-3, atol=2e-3)
    # a backend that saves no compiled form (triton) is rebuilt from the program at load, and says so
    notes = [] if rows[exported.backend]["artifact"] else [f"runs '{exported.backend}'"]
    assert loaded.backend == exported.backend, loaded.backend
    assert len(_fallbacks(caught)) == len(notes) and all(n in w for n, w in zip(notes, _fallbacks(caught))), caught
    if loader_died:
        pytest.xfail(
            f"AOTInductor's loader died here, outside torchmux ({rows['inductor']['reason']}); the package ran eager, right"
        )


def test_bench_zoo_bert_on_cuda_under_auto() -> None:
    torch.manual_seed(0)
    model, args = zoo.build("bert", 2)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    compiled = torchmux.compile(model, backend="auto")
    with torch.no_grad():
        want = zoo.tensors_of(model(*args))
        for _ in range(3):
            got = zoo.tensors_of(compiled(*args))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-3, atol=2e-3)


def test_export_measures_each_backend_replayed_as_a_cuda_graph(tmp_path) -> None:
    """Static shapes on CUDA: AOTInductor's loaded library is also timed replayed as one CUDA graph
    (``inductor+cudagraphs``), checked like any candidate; a package told to run it records it again at
    load and answers as eager does, call after call, never writing the caller's input. The bench's ResNet
    at batch 8 under no_grad, as it ran on an H200 (2026-11-27, where auto chose it); a first form of this
    test (a 3-layer CNN at batch 4, export under grad mode) died on that machine, cause not established."""
    torch.manual_seed(0)
    model, args = zoo.build("resnet", 8)
    model, (x,) = model.cuda().eval(), tuple(a.cuda() for a in args)
    with torch.no_grad():
        exported = torchmux.export(model, (x,), backend=["inductor", "eager"])
    rows = {c["backend"]: c for c in exported.plan["candidates"]}
    assert "inductor+cudagraphs" in rows, rows["inductor"]["reason"]  # only a shipped candidate is recorded
    assert rows["inductor+cudagraphs"]["ok"], rows["inductor+cudagraphs"]["reason"]
    assert rows["inductor+cudagraphs"]["artifact"] == "artifacts/inductor/"
    path = exported.save(tmp_path / "resnet.tmux")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = torchmux.load(path, backend="inductor+cudagraphs")
    assert loaded.backend == "inductor+cudagraphs" and _fallbacks(caught) == [], _fallbacks(caught)
    with torch.no_grad():
        xs = [torch.randn_like(x) for _ in range(3)]
        before = [a.clone() for a in xs]
        outs = [loaded(a) for a in xs]
        for a, b, out in zip(xs, before, outs):
            assert torch.equal(a, b)
            torch.testing.assert_close(out, model(a), rtol=2e-3, atol=2e-3)
