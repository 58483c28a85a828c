"""The Triton fusion code generator, under Triton's CPU interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports triton).

Every test builds a graph with torchmux's tracer, compiles it with the real code generator, runs the
real Triton kernels and compares with the reference interpreter on random inputs. Fusion is checked by
counting kernels against ops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from torchmux.autotune.placement import build_placement  # noqa: E402
from torchmux.backends.triton import TritonBackend  # noqa: E402
from torchmux.backends.triton.fusion import MAX_ROW, Extern, op_key, plan  # noqa: E402
from torchmux.backends.triton.runtime import compile_graph  # noqa: E402
from torchmux.core.backend import CompileRequest  # noqa: E402
from torchmux.core.compare import mismatch  # noqa: E402
from torchmux.core.trace import trace  # noqa: E402

interpreting = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(
    not (interpreting or torch.cuda.is_available()),
    reason="needs CUDA or TRITON_INTERPRET=1 set before triton is imported (tests/conftest.py sets it)",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


def run(fn, *args, name: str = "g"):
    """Trace, compile, run, compare: (compiled graph, its IR). Fails with the mismatch if any."""
    ir = trace(fn, args, name=name)
    compiled = compile_graph(ir, args)
    err = mismatch(compiled(*args), ir.run_reference(*args))
    assert err is None, f"{name}: {err}\n{ir}"
    return compiled, ir


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def chain10(x, scale, shift):
    y = x * scale + shift
    y = torch.sigmoid(y) * y
    y = torch.tanh(y) + 0.5 * y
    y = torch.exp(-y.abs()) * y - 0.1
    return torch.relu(y) + x


# ------------------------------------------------------------------------------------------------
# fused chains against the reference
# ------------------------------------------------------------------------------------------------


def test_gelu_of_linear_times_scale_is_one_kernel_after_the_matmul():
    x, w, b, s = rand(37, 24), rand(24, 40), rand(40), rand(40)
    compiled, ir = run(lambda x, w, b, s: F.gelu(x @ w + b) * s, x, w, b, s)
    steps = plan(ir.graph)
    assert any(isinstance(st, Extern) and "mm" in str(st.node.target) for st in steps)  # ATen matmul
    assert compiled.kernel_count == 1 < len(ir.op_nodes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax_and_log_softmax(dtype):
    x = rand(70, 129, dtype=dtype)  # ragged rows and row length
    compiled, _ = run(lambda x: torch.softmax(x, -1), x)
    assert compiled.kernel_count == 1
    run(lambda x: torch.log_softmax(x, 0), x)  # across rows: a strided reduction


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_norm(dtype):
    x, w, b = rand(3, 17, 96, dtype=dtype), rand(96, dtype=dtype), rand(96, dtype=dtype)
    compiled, _ = run(lambda x, w, b: F.layer_norm(x, (96,), w, b), x, w, b)
    assert compiled.kernel_count == 1
    run(lambda x: F.layer_norm(x, (17, 96)), x)  # two normalized dims, no affine


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_is_one_kernel(dtype):
    x, w = rand(2, 33, 80, dtype=dtype), rand(80, dtype=dtype)
    compiled, ir = run(rms_norm, x, w)
    assert compiled.kernel_count == 1 and len(ir.op_nodes) == 6


def test_group_norm_regroups_channels_in_the_index():
    x, w, b = rand(2, 6, 5, 4), rand(6), rand(6)
    compiled, _ = run(lambda x, w, b: torch.relu(F.group_norm(x, 3, w, b)), x, w, b)
    assert compiled.kernel_count == 2  # the norm, then the relu (it reads [N, C, ...], the norm [N, G, C/G, ...])
    run(lambda x: torch.ops.aten.native_group_norm(x, None, None, 2, 6, 20, 3, 1e-5), x)  # with its statistics


def test_residual_add_then_norms_share_a_kernel():
    x, y, w, b = rand(4, 50, 64), rand(4, 50, 64), rand(64), rand(64)

    def block(x, y, w, b):
        h = x + y * 0.5
        return F.layer_norm(h, (64,), w, b), rms_norm(h, w) + h

    compiled, ir = run(block, x, y, w, b)
    assert compiled.kernel_count == 1 < len(ir.op_nodes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ten_pointwise_ops_with_broadcasting_are_one_kernel(dtype):
    x, scale, shift = rand(3, 70, 100, dtype=dtype), rand(100, dtype=dtype), rand(70, 1, dtype=dtype)
    compiled, ir = run(chain10, x, scale, shift)  # 21000 elements: several programs, a ragged tail
    assert len(ir.op_nodes) >= 10
    assert compiled.kernel_count == 1


def test_reductions_over_non_last_dims():
    x = rand(6, 45, 7)
    run(lambda x: x.sum(0), x)
    run(lambda x: x.mean(1, keepdim=True) * x, x)
    run(lambda x: (x.amax(1), x.amin((0, 2)), x.var(1)), x)
    compiled, _ = run(lambda x: x - x.mean((0, 2), keepdim=True), x)
    assert compiled.kernel_count == 1


def test_argmax_prod_cumsum_and_any_in_registers():
    x = rand(6, 45)
    run(lambda x: (x.argmax(-1), x.argmax(0, keepdim=True), x.argmax()), x)
    run(lambda x: (x * 0.1 + 1).prod(-1) + (x * 0.1 + 1).prod(0, keepdim=True).sum(), x)
    compiled, _ = run(lambda x: torch.exp(x.cumsum(1) * 0.1) * 2, x)
    assert compiled.kernel_count == 1
    run(lambda x: ((x > 1).any(1), torch.logical_not(x > -2).any(0, keepdim=True)), x)


def test_transposed_and_sliced_inputs_are_read_through_strides():
    base = rand(40, 56)
    xt = base.t()  # non-contiguous input
    fn = lambda x, y: torch.softmax(x * 2, -1) + y[:, 1::2].t().sum(-1, keepdim=True)  # noqa: E731
    compiled, ir = run(fn, xt, rand(40, 112))
    assert compiled.kernel_count == 1
    # the same compiled graph, called with a contiguous tensor of the same shape: strides are arguments
    xc = xt.contiguous()
    y = rand(40, 112, seed=3)
    assert mismatch(compiled(xc, y), ir.run_reference(xc, y)) is None
    run(lambda x: (x.permute(1, 0) + 1).unsqueeze(0).expand(2, 40, 56) * 3, rand(56, 40))


def test_padding_and_concatenation_are_masked_loads_in_one_kernel():
    x, y, z = rand(6, 9), rand(6, 4), rand(2, 9)
    for fn, args in [
        (lambda x: F.pad(x * 2, (1, 2, 3, 0), value=0.5).exp(), (x,)),
        (lambda x: F.pad(x, (-1, 2)) + 1, (x,)),  # negative padding crops
        (lambda x, y: torch.cat([x * 2, y, x[:, :1]], 1).sigmoid(), (x, y)),
        (lambda x, z: torch.softmax(torch.cat([x, z + 1], 0), -1), (x, z)),
    ]:
        compiled, _ = run(fn, *args)
        assert compiled.kernel_count == 1


def test_embedding_index_and_gather_read_at_loaded_positions():
    w, pos, x = rand(10, 6), rand(3, 6), rand(6, 8)
    ids = torch.tensor([[1, 9, 0], [0, 3, 3]], device=DEVICE)
    compiled, _ = run(lambda w, i, p: F.layer_norm(F.embedding(i, w) + p, (6,)), w, ids, pos)
    assert compiled.kernel_count == 1  # embedding, position add and layer norm
    run(lambda x, i: x[i] * 2, x, torch.tensor([-1, 2, -6, 5], device=DEVICE))  # negative indices wrap
    run(lambda x, i: torch.gather(x.exp(), 1, i) + 1, x, torch.randint(0, 8, (6, 3), device=DEVICE))


def test_pooling_windows_are_unrolled_loads():
    img = rand(2, 3, 9, 8)
    compiled, _ = run(lambda x: torch.relu(F.max_pool2d(x * 2, 3, 2, 1)), img)
    assert compiled.kernel_count == 1
    run(lambda x: F.avg_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), img)


def test_non_fusible_view_splits_the_kernel_and_stays_correct():
    x = rand(4, 6, 8)
    compiled, ir = run(lambda x: torch.softmax((x + 1).reshape(4, 48), -1), x)
    assert compiled.kernel_count == 2  # the reshape regroups dims: a buffer and an ATen view between


def test_row_longer_than_a_block_is_reduced_by_aten():
    x = rand(2, MAX_ROW + 10)
    compiled, ir = run(lambda x: torch.exp(x).sum(-1) * 2, x)
    assert compiled.kernel_count == 2  # exp, then (ATen sum), then the scale


# ------------------------------------------------------------------------------ symbolic sizes
def _symbolic(fn, sizes, name):
    """``fn``'s one symbolic graph (Dynamo, dynamic=True) and its arguments at each of ``sizes``."""
    from torchmux.testing.check import symbolic_calls

    return symbolic_calls(fn, sizes, name)


def norms_over_rows(x, w, b):
    """Softmax, layer norm, RMS norm and a mean over rows whose length is the symbolic last dim."""
    y = torch.softmax(x * 0.5, -1) + F.layer_norm(x, (x.shape[-1],), w, b)
    return y, rms_norm(x, w), (x - x.mean(-1, keepdim=True)).amax(1)


def test_symbolic_graph_compiles_once_and_answers_at_every_size():
    from torchmux.backends.triton import runtime

    sizes = [(2, 5), (4, 17), (5, 64), (6, 129)]  # rows crossing block (power of two) boundaries
    args = [[rand(b, 3, n, seed=b), rand(n, seed=1), rand(n, seed=2)] for b, n in sizes]
    ir, calls = _symbolic(norms_over_rows, args, "rows")
    assert not ir.is_static
    compiled = compile_graph(ir, calls[0])
    loaded = len(runtime._loaded)
    assert compiled.kernel_count <= 2 and all("sym_" in ks.source and ks.symbols for ks in compiled.sources)
    for a in calls:
        err = mismatch(compiled(*a), ir.run_reference(*a))
        assert err is None, f"at {[tuple(t.shape) for t in a if isinstance(t, torch.Tensor)]}: {err}"
    assert len(runtime._loaded) == loaded  # no kernel was generated or loaded for a new size
    for launch in compiled.launches:  # Triton builds a binary per block size: only the row block varies
        blocks = {(c.block_r, c.block_k, c.num_warps) for c in launch.configs.values()}
        assert len(blocks) == len({c.block_k for c in launch.configs.values()}) >= 1
    assert max(len(launch.configs) for launch in compiled.launches) == len(sizes)


def test_symbolic_row_longer_than_a_block_runs_in_aten_for_that_call():
    args = [[rand(2, n, seed=n)] for n in (5, MAX_ROW + 3, 9)]
    ir, calls = _symbolic(lambda x: torch.softmax(x, -1) * 2, args, "long")
    compiled = compile_graph(ir, calls[0])
    assert compiled.kernel_count == 1
    for a in calls:
        assert mismatch(compiled(*a), ir.run_reference(*a)) is None


def test_symbolic_padding_concat_slices_and_gathers():
    def fn(x, ids, table):
        y = torch.cat([F.pad(x, (1, 2)), x[:, 1:] * 2, x[:, :1]], 1)
        return y.sin(), table[ids] + 1, x.select(1, -1)

    args = [[rand(b, n, seed=n), torch.randint(0, 7, (b,)), rand(7, 5)] for b, n in ((2, 4), (5, 9))]
    ir, calls = _symbolic(fn, args, "spans")
    compiled = compile_graph(ir, calls[0])
    for a in calls:
        assert mismatch(compiled(*a), ir.run_reference(*a)) is None


def test_torchmux_list_says_it_takes_symbolic_shapes():
    from torchmux.core.registry import list_backends

    [row] = [r for r in list_backends() if r.name == "triton"]
    assert row.dynamic_shapes and TritonBackend.dynamic_shapes


def test_model_called_with_many_lengths_compiles_twice_end_to_end(monkeypatch):
    import torchmux
    from torchmux.core.errors import TorchmuxFallbackWarning
    from torchmux.core.registry import get_registry

    backend = get_registry().get("triton")
    real, compiles = backend.compile, []
    monkeypatch.setattr(backend, "compile", lambda request: compiles.append(request.ir.is_static) or real(request))

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

        def forward(self, x):
            h = self.norm(torch.relu(self.lin(x)))
            return torch.softmax(h @ h.transpose(-1, -2) * 0.25, -1) @ h

    torch.manual_seed(0)
    model = Attention().eval()
    torch._dynamo.reset()
    compiled = torchmux.compile(model, backend="triton")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", TorchmuxFallbackWarning)
        for n in (5, 9, 16, 33, 7, 64):
            x = rand(1, n, 16, seed=n)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
    assert compiles == [True, False]  # the first length's static graph, then one symbolic graph


def test_batch_norm_relu_and_repeated_operands_fuse():
    x = rand(2, 6, 9, 9)
    mean, var, w, b = rand(6), rand(6).abs() + 0.5, rand(6), rand(6)
    fn = lambda x, m, v, w, b: torch.relu(F.batch_norm(x, m, v, w, b, training=False) + x * x)  # noqa: E731
    compiled, _ = run(fn, x, mean, var, w, b)
    assert compiled.kernel_count == 1


def test_constant_exponents():
    x = rand(4, 9)
    x[0, 0] = 0.0
    run(lambda x: (x**2.5, x**-1.5, x**-2, x**5, x**0, x**0.5, x**-3), x)


def test_integer_and_bool_values_flow_through():
    x, y = rand(5, 9), rand(5, 9)
    run(lambda x, y: torch.where(x > y, (x * 4).to(torch.int32), torch.arange(9, dtype=torch.int32)), x, y)
    run(lambda x, y: torch.logical_and(x > 0, torch.logical_not(y >= 0.1)), x, y)


def test_small_autotune_picks_one_of_the_candidate_block_sizes():
    x, w = rand(300, 40), rand(40)
    ir = trace(rms_norm, [x, w], name="tuned")
    compiled = TritonBackend().compile(CompileRequest(ir, [x, w], mode="max-autotune"))
    [launch] = compiled.launches
    assert len(launch.ks.candidates) > 1 and launch.config in launch.ks.candidates and not launch.tune
    assert mismatch(compiled(x, w), ir.run_reference(x, w)) is None


def test_kernel_count_reaches_the_placement():
    x, w = rand(8, 32), rand(32)
    ir = trace(rms_norm, [x, w], name="placed")
    placement = build_placement(ir, TritonBackend(), [x, w], mode=None, options={})
    assert placement.kernels == 1 and placement.ops_eager == 0


def test_debug_dir_gets_every_kernel_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMUX_DEBUG_DIR", str(tmp_path))
    x = rand(4, 6, 8)
    compiled, _ = run(lambda x: torch.softmax((x + 1).reshape(4, 48), -1), x, name="debugged")
    files = sorted(tmp_path.glob("*.py"))
    assert len(files) == compiled.kernel_count == 2
    for f in files:
        text = f.read_text()
        assert "@triton.jit" in text and "tl.store" in text and f.stem.startswith("debugged_")


# ------------------------------------------------------------------------------------------------
# the backend object and the registry
# ------------------------------------------------------------------------------------------------


def test_backend_reports_interpreter_and_is_not_auto_on_cpu():
    b = TritonBackend()
    assert b.availability().ok
    if not torch.cuda.is_available():
        assert b.devices == ("cuda", "cpu") and b.auto is False


def test_without_interpreter_or_gpu_the_reason_says_what_to_do():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import torch, torchmux; from torchmux.backends.triton import TritonBackend; b = TritonBackend(); "
        "a = b.availability(); print(torch.cuda.is_available(), a.ok, b.devices, '|', a.reason)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("False"):
        assert "False ('cuda',) | no CUDA GPU; set TRITON_INTERPRET=1" in out.stdout


def test_claims_only_what_the_generator_handles():
    b = TritonBackend()
    claimed = b.claims["float32"]  # from the conformance suite (claims.json)
    assert "aten._softmax.default" in claimed and "aten.mm.default" in claimed
    assert "aten.native_dropout.default" not in claimed  # no lowering: runs eagerly via the partitioner
    ir = trace(
        lambda x: torch.nn.functional.dropout(x, 0.5, training=True).unsqueeze(0), [rand(8, 8)], name="unclaimed"
    )
    supported = {op_key(n).split(".")[0]: b.supports(n) for n in ir.op_nodes}
    assert supported["unsqueeze"] is True and not all(supported.values())


_GPU_SCRIPT = """
import torch, torch.nn.functional as F
from torchmux.core.trace import trace
from torchmux.core.compare import mismatch
from torchmux.backends.triton.runtime import compile_graph, interpreting
assert not interpreting()
def chain10(x, scale, shift):
    y = x * scale + shift
    y = torch.sigmoid(y) * y
    y = torch.tanh(y) + 0.5 * y
    y = torch.exp(-y.abs()) * y - 0.1
    return torch.relu(y) + x
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    r = lambda *s: torch.randn(s, device="cuda").to(dtype)
    for fn, args in [
        (chain10, (r(64, 3000), r(3000), r(64, 1))),
        (lambda x: torch.softmax(x, -1), (r(300, 1000),)),
        (lambda x, w, b: F.layer_norm(x, (768,), w, b), (r(4, 100, 768), r(768), r(768))),
        (lambda x: (x.t() * 2).sum(0) + x.amax(1), (r(500, 500),)),
        (lambda w, i: F.embedding(i, w).cumsum(1), (r(100, 64), torch.randint(0, 100, (8, 16), device="cuda"))),
    ]:
        ir = trace(fn, args)
        compiled = compile_graph(ir, args)
        err = mismatch(compiled(*args), ir.run_reference(*args))
        assert err is None, (dtype, err)
print("gpu ok")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: compiles real Triton kernels")
def test_compiled_kernels_on_the_gpu():
    """The same code generator, compiled for the GPU (not interpreted): a subprocess without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _GPU_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "gpu ok" in out.stdout, out.stderr[-3000:]


# ------------------------------------------------------------------------------------------------
# Hugging Face models through torchmux.compile
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_hf_model_matches_eager(model):
    pytest.importorskip("transformers")
    import torchmux
    from torchmux import TorchmuxFallbackWarning
    from torchmux.bench.zoo import build, tensors_of

    torch._dynamo.reset()
    m, args = build(model, 1)
    with torch.no_grad(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ref = tensors_of(m(*args))
        compiled = torchmux.compile(m, backend="triton")
        out = tensors_of(compiled(*args))
    fallbacks = [str(r.message) for r in record if issubclass(r.category, TorchmuxFallbackWarning)]
    assert not fallbacks, fallbacks  # the triton placement answered right: no graph fell back to eager
    assert len(out) == len(ref) > 0
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
