"""Dynamic shapes (autotune/shapes.py, core/ir.py symbols, onnxruntime dynamic axes): a program called
with many sizes compiles a bounded number of times per backend and answers as eager on every call."""

from __future__ import annotations

import random
import subprocess
import sys
import warnings

import pytest
import torch

import torchmux
from torchmux.core.errors import IRLintError, TorchmuxFallbackWarning
from torchmux.core.registry import get_registry
from torchmux.frontends.dynamo import TorchmuxDynamoBackend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo caches graphs per code object (nn.Sequential.forward is shared by every test's model):
    leave none of ours behind for the next test module."""
    yield
    torch._dynamo.reset()


CAPTURE = """
import torch
from torchmux.frontends.dynamo import TorchmuxDynamoBackend
irs = []
def place(ir):
    irs.append(ir)
    return lambda *a: ir.run_reference(*a)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
c = torch.compile(m, backend=TorchmuxDynamoBackend(place), dynamic=True)
with torch.no_grad():
    c(torch.randn(3, 16))
"""


def _symbolic_ir():
    scope: dict = {}
    exec(CAPTURE, scope)  # noqa: S102 - the same program the subprocess test runs
    return scope["irs"][-1]


def test_ir_carries_symbols_with_ranges_and_prints_them():
    ir = _symbolic_ir().lint()
    assert not ir.is_static
    (sym,) = ir.symbols.values()
    assert sym.lo == 2 and sym.hi is None  # Dynamo specializes 0 and 1
    assert f"f32[{sym.name}, 16] input" in str(ir) and f"SymInt({sym.name})" in str(ir)


def test_lint_refuses_a_symbol_no_input_defines():
    ir = _symbolic_ir()
    x = next(
        n
        for n in ir.placeholders
        if isinstance(n.meta["val"], torch.Tensor) and not ir.input_specs[ir.placeholders.index(n)].is_static
    )
    n_ph = next(n for n in ir.placeholders if isinstance(n.meta["val"], torch.SymInt))
    fake = x.meta["val"]
    with fake.fake_mode:
        x.meta["val"] = torch.empty(3, 16)
    n_ph.meta["val"] = 3
    with pytest.raises(IRLintError, match="no input defines"):
        ir.lint()


def test_symbolic_fingerprint_is_stable_across_processes():
    code = CAPTURE + "print(irs[-1].fingerprint())"
    prints = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
        for _ in range(2)
    ]
    assert prints[0] == prints[1] == _symbolic_ir().fingerprint()


def _counting(monkeypatch, names):
    counts = dict.fromkeys(names, 0)
    for name in names:
        backend = get_registry().get(name)
        real = backend.compile

        def counted(request, real=real, name=name):
            counts[name] += 1
            return real(request)

        monkeypatch.setattr(backend, "compile", counted)
    return counts


def _sweep(compiled, model, make, sizes):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchmuxFallbackWarning)  # no silent (or loud) fallback to eager
        with torch.no_grad():
            for n in sizes:
                args = make(n)
                torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)


SIZES = random.Random(13).sample(range(2, 200), 50)


@pytest.mark.parametrize("backends", [["eager", "onnxruntime"], ["tvm"]], ids=["auto-eager-onnxruntime", "tvm"])
def test_mlp_50_batch_sizes_compile_once_per_backend(monkeypatch, backends):
    torch._dynamo.reset()
    counts = _counting(monkeypatch, backends)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    compiled = torchmux.compile(model, backend=backends if len(backends) > 1 else backends[0])
    _sweep(compiled, model, lambda n: (torch.randn(n, 16),), SIZES)
    # the first size's static graph, then one symbolic graph for every other size
    assert counts == dict.fromkeys(backends, 2)


def test_tiny_bert_50_sequence_lengths(monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    counts = _counting(monkeypatch, ["onnxruntime"])
    compiled = torchmux.compile(model, backend="onnxruntime")
    g = torch.Generator().manual_seed(0)
    lengths = random.Random(7).sample(range(2, 128), 50)
    after_two = None
    with torch.no_grad():
        for i, n in enumerate(lengths):
            if i == 2:
                after_two = dict(counts)  # the static graph of the first length and the symbolic graph
            ids = torch.randint(0, 100, (1, n), generator=g)
            with warnings.catch_warnings():
                warnings.simplefilter("error", TorchmuxFallbackWarning)
                got = compiled(input_ids=ids).last_hidden_state
            torch.testing.assert_close(got, model(input_ids=ids).last_hidden_state, rtol=1e-4, atol=1e-4)
    # nothing compiles after the second length (the model's graph goes to a few ONNX regions around
    # the ops onnxruntime does not claim, each compiled once for the static and once for the symbolic graph)
    assert counts == after_two, (counts, after_two)


def test_static_only_backend_is_specialized_a_bounded_number_of_times():
    from torchmux.autotune.shapes import SPECIALIZE_LIMIT

    pytest.importorskip("torchmux_example_plugin")
    from torchmux_example_plugin import CALLS

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    compiled = torchmux.compile(model, backend="example", dynamic=True)
    before = CALLS["count"]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in range(2, 4 + SPECIALIZE_LIMIT):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), model(x))
    fallbacks = [w for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
    assert CALLS["count"] > before  # the specializations ran on the backend
    assert fallbacks and "dynamic_shapes" in str(fallbacks[0].message)  # past the limit: said, not silent


def test_recompile_limit_is_a_warning_that_says_what_to_do():
    torch._dynamo.reset()
    model = torch.nn.Linear(4, 4)
    compiled = torchmux.compile(model, backend="eager", dynamic=False)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for n in range(2, 4 + torch._dynamo.config.recompile_limit):
            compiled(torch.randn(n, 4))
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, TorchmuxFallbackWarning))
    assert "recompile_limit" in text and "size mismatch at index 0" in text and "dynamic=True" in text


def test_mark_dynamic_is_honoured(monkeypatch):
    torch._dynamo.reset()
    counts = _counting(monkeypatch, ["onnxruntime"])
    model = torch.nn.Linear(4, 4)
    compiled = torchmux.compile(model, backend="onnxruntime")
    with torch.no_grad():
        for n in (3, 5, 9):
            x = torch.randn(n, 4)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x))
    assert counts["onnxruntime"] == 1  # symbolic from the first call


def test_symbolic_graph_keeps_a_winner_per_size_range():
    from torchmux.autotune.shapes import size_range

    assert size_range({"s0": 5}) == size_range({"s0": 7}) != size_range({"s0": 8})
    unused = TorchmuxDynamoBackend  # the frontend the chooser serves
    assert unused is not None


def test_each_size_range_is_tuned_once_and_remembered_on_disk(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    sizes = [3, 5, 6, 9, 12, 17]  # after the static first graph: ranges 4-7, 8-15, 16-31

    def sweep() -> dict:
        torch._dynamo.reset()
        counts = _counting(monkeypatch, ["eager", "onnxruntime"])
        _sweep(torchmux.compile(model, backend=["eager", "onnxruntime"]), model, lambda n: (torch.randn(n, 8),), sizes)
        return counts

    first = sweep()
    records = [json.loads(p.read_text()) for p in (tmp_path / "decisions").glob("*.json")]
    ranges = sorted(r["range"] for r in records if "range" in r)
    assert len(ranges) == 3 and all(r.startswith("s") for r in ranges), ranges
    assert first == {"eager": 2, "onnxruntime": 2}
    # a new process (here: a fresh capture) compiles only each remembered winner for the symbolic graph
    second = sweep()
    winners = {r["backend"] for r in records if "range" in r}
    assert sum(second.values()) <= 2 + len(winners), (second, winners)


def test_training_with_changing_batch_on_onnxruntime():
    """Symbolic forward and backward graphs (the forward saves the batch size for the backward)."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(reference)
    compiled = torchmux.compile(model, backend="onnxruntime")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchmuxFallbackWarning)
        for n in (4, 6, 9, 13):
            x = torch.randn(n, 16)
            reference(x).square().mean().backward()
            compiled(x).square().mean().backward()
            for p, q in zip(reference.parameters(), model.parameters()):
                torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4)
                p.grad = q.grad = None
