"""The ONNX Runtime backend: real exports, real sessions, real IOBinding, real subprocesses.

The conformance suite (tests/conformance) covers the ops it claims; these tests cover the rest:
provider reporting, IOBinding on torch memory, the disk cache across processes, new shapes, zoo
models against eager, and falling back to eager when a compile really fails.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import warnings
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torchmux
from torchmux.bench import zoo
from torchmux.core.compare import mismatch
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace

pytest.importorskip("onnxruntime")
if not get_registry().availability("onnxruntime").ok:
    pytest.skip(
        f"onnxruntime backend unavailable: {get_registry().availability('onnxruntime').reason}", allow_module_level=True
    )

import onnxruntime as ort  # noqa: E402

from torchmux.backends.onnxruntime import CPU, CUDA, usable_providers  # noqa: E402
from torchmux.backends.onnxruntime.session import OrtGraph  # noqa: E402

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b)).softmax(-1)


def _linear_inputs(batch: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)]


def _compile(fn, inputs, **options) -> OrtGraph:  # type: ignore[no-untyped-def]
    ir = trace(fn, inputs, name="t")
    return get_registry().get("onnxruntime").compile(torchmux.CompileRequest(ir, inputs, options=options))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of this test's own (inherited by the subprocesses it starts)."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    return tmp_path / "onnxruntime"


@pytest.fixture(scope="module")
def measured() -> list[tuple[str, str, bool, str]]:
    """Every (graph, backend, ok, reason) the autotuner reports while this module runs."""
    seen: list[tuple[str, str, bool, str]] = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):  # type: ignore[no-untyped-def]
            seen.append((ir.name, backend, ok, reason))

    registry = get_registry()
    registry.register(Observer(), "test_onnxruntime_observer")
    yield seen
    registry.pm.unregister(name="test_onnxruntime_observer")


# ------------------------------------------------------------------------------------- availability
def test_availability_names_the_usable_providers() -> None:
    registry = get_registry()
    assert registry.availability("onnxruntime").ok
    row = next(r for r in torchmux.list_backends() if r.name == "onnxruntime")
    assert row.version == ort.__version__
    assert row.package in ("onnxruntime-gpu", "onnxruntime") or row.plugin == "onnxruntime"
    providers = usable_providers()
    assert providers[-1] == CPU and set(providers) <= set(ort.get_available_providers())
    assert f"providers usable here: {', '.join(providers)}" in row.description
    if not torch.cuda.is_available():  # the GPU build lists CUDA even where no GPU is
        assert providers == (CPU,)


def test_import_torchmux_without_onnxruntime() -> None:
    """The cheap module imports no onnxruntime; with onnxruntime missing, list_backends says what to install."""
    code = textwrap.dedent("""
        import sys
        import torchmux
        from torchmux.core.registry import get_registry
        get_registry()
        loaded = "onnxruntime" in sys.modules
        sys.modules["onnxruntime"] = None  # from here on, `import onnxruntime` fails as if not installed
        row = next(r for r in torchmux.list_backends() if r.name == "onnxruntime")
        print(loaded, row.available, row.reason)
    """)
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded, available, reason = out.stdout.strip().splitlines()[-1].split(" ", 2)
    assert loaded == "False", "loading the registry imported onnxruntime"
    assert available == "False" and "pip install onnxruntime" in reason


def test_supports_rejects_what_fails() -> None:
    backend = get_registry().get("onnxruntime")
    half = trace(torch.abs, [torch.randn(4, 8).half()])  # the exporter returns float32 for float16 abs
    assert not any(backend.supports(n) for n in half.op_nodes)
    bf16 = trace(torch.relu, [torch.randn(4, 8).bfloat16()])  # IOBinding has no NumPy type for bfloat16
    assert not any(backend.supports(n) for n in bf16.op_nodes)
    ok = trace(torch.relu, [torch.randn(4, 8).half()])
    assert all(backend.supports(n) for n in ok.op_nodes)


# ------------------------------------------------------------------------------------- IOBinding
def test_iobinding_runs_on_torch_memory(cache_dir: Path) -> None:
    inputs = _linear_inputs()
    graph = _compile(_linear_gelu, inputs)
    assert isinstance(graph, OrtGraph) and graph.providers == [CPU]
    # outputs are written straight into torch tensors the caller allocated: no NumPy array in between
    outs = [torch.empty(8, 24)]
    ptr = outs[0].data_ptr()
    result = graph.run_into(inputs, outs)
    assert result[0] is outs[0] and outs[0].data_ptr() == ptr
    torch.testing.assert_close(outs[0], _linear_gelu(*inputs), atol=1e-5, rtol=1e-5)
    # a call returns fresh torch tensors (a later call must not overwrite what the caller holds)
    first, second = graph(*inputs)[0], graph(*inputs)[0]
    assert isinstance(first, torch.Tensor) and first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, second)
    graph._c = None  # the public IOBinding API (used where onnxruntime's C-level objects differ) agrees
    torch.testing.assert_close(graph(*inputs)[0], first)


def test_static_cpu_call_takes_the_outputs_onnxruntime_allocates(cache_dir: Path) -> None:
    """A static CPU inference graph's call feeds NumPy views of the inputs and returns ONNX Runtime's own
    output memory as tensors: writable, never reused by a later call, one tensor for a value returned
    twice; a training graph's outputs stay torch's own, resizable memory."""
    x = torch.randn(3, 4)
    ir = trace(lambda x: ((x * 2).exp(),) * 2 + (x.sum(),), [x], name="twice")
    graph = get_registry().get("onnxruntime").compile(torchmux.CompileRequest(ir, [x]))
    assert graph._static is not None  # this is the path under test
    a, b, total = graph(x)
    assert a is b and total.shape == ()
    held = a.clone()
    later = graph(x * 3)[0]
    assert torch.equal(a, held) and not torch.equal(later, a)  # the later call wrote elsewhere
    a.add_(1)  # the caller owns it: writable, in place
    torch.testing.assert_close(a, held + 1)
    x_grad = x.clone().requires_grad_()  # an input that requires grad
    torch.testing.assert_close(graph(x_grad)[0], (x * 2).exp())
    # a training graph's outputs are torch's own memory (FSDP frees tensors with storage.resize_(0))
    fw = torchmux.GraphIR(ir.gm, name="twice_fw", phase="forward").lint()
    fw_graph = get_registry().get("onnxruntime").compile(torchmux.CompileRequest(fw, [x]))
    out = fw_graph(x)[0]
    torch.testing.assert_close(out, (x * 2).exp())
    out.untyped_storage().resize_(0)
    assert graph(x)[0].untyped_storage().resizable() is False  # the inference graph's: ONNX Runtime's


def test_weights_are_inputs_and_strided_inputs_work(cache_dir: Path) -> None:
    inputs = _linear_inputs()
    graph = _compile(_linear_gelu, inputs)
    x, w, b = inputs
    w.mul_(-2.0)  # weights change between calls (training): the session must see the new values
    torch.testing.assert_close(graph(x, w, b)[0], _linear_gelu(x, w, b), atol=1e-5, rtol=1e-5)
    xt = torch.randn(16, 8).t()  # a non-contiguous input of the right shape
    torch.testing.assert_close(graph(xt, w, b)[0], _linear_gelu(xt, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name,fn,shapes",
    [
        ("passthrough", lambda x: (x + 1, x), [(3, 4)]),  # an output that is an input
        ("same_twice", lambda x: ((x * 2).exp(),) * 2, [(3, 4)]),  # one value returned twice
        ("empty_output", lambda x: x[:, :0] + 1, [(3, 4)]),  # data_ptr() of an empty tensor is 0
        ("empty_input", lambda x, y: (x + 1, y * 2), [(3, 4), (0, 4)]),
        ("unused_input", lambda x, y: x.exp(), [(3, 4), (2,)]),
        ("int_and_scalar", lambda x: (x.argmax(0), x.sum()), [(3, 4)]),
    ],
)
def test_graph_edges(name: str, fn, shapes: list, cache_dir: Path) -> None:  # type: ignore[no-untyped-def]
    inputs = [torch.randn(s) for s in shapes]
    ir = trace(fn, inputs, name=name)
    graph = get_registry().get("onnxruntime").compile(torchmux.CompileRequest(ir, inputs))
    assert mismatch(graph(*inputs), ir.run_reference(*inputs)) is None


# ------------------------------------------------------------------------------------- disk cache
_CHILD = textwrap.dedent("""
    import socket
    connects = []
    def refuse(*a, **k):  # any network use (a download, a DNS lookup) is recorded and refused
        connects.append(repr(a)[:100])
        raise OSError("network access refused by the test")
    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.getaddrinfo = socket.create_connection = refuse

    import json, sys, time, torch
    import torch.nn.functional as F
    import torchmux
    from torchmux.core.registry import get_registry
    from torchmux.core.trace import trace
    import torchmux.backends.onnxruntime.session as impl

    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b)).softmax(-1)

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(8, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)]
    exports = []
    real_export = impl.export_onnx
    impl.export_onnx = lambda *a: exports.append(1) or real_export(*a)  # count, then really export
    ir = trace(fn, inputs, name="t")
    t0 = time.perf_counter()
    graph = get_registry().get("onnxruntime").compile(torchmux.CompileRequest(ir, inputs))
    seconds = time.perf_counter() - t0
    err = float((graph(*inputs)[0] - fn(*inputs)).abs().max())
    print(json.dumps(dict(hit=graph.cache_hit, exports=len(exports), folder=str(graph.folder), err=err,
                          seconds=seconds, connects=connects)))
""")


def _child() -> dict:
    out = subprocess.run([PY, "-c", _CHILD], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_disk_cache_hit_in_a_new_process(cache_dir: Path) -> None:
    """A second process compiling the same graph loads the cached model and exports nothing; neither
    process touches the network."""
    first = _child()
    assert not first["hit"] and first["exports"] == 1 and first["err"] < 1e-5, first
    folder = Path(first["folder"])
    assert folder.parent == cache_dir
    files = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert {"model.onnx", "model.opt.onnx"} <= set(files)
    second = _child()  # same graph, new process
    assert second["hit"] and second["exports"] == 0, second
    assert second["folder"] == first["folder"] and second["err"] < 1e-5
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == files  # nothing rewritten
    assert first["connects"] == second["connects"] == []
    # the same graph in this process hits the cache too
    graph = _compile(_linear_gelu, _linear_inputs())
    assert graph.cache_hit and graph.folder == folder and graph.export_seconds == 0


def test_cache_key_changes_with_providers(cache_dir: Path) -> None:
    inputs = _linear_inputs()
    default = _compile(_linear_gelu, inputs)
    explicit = _compile(_linear_gelu, inputs, providers=[(CPU, {"arena_extend_strategy": "kSameAsRequested"})])
    assert default.folder != explicit.folder and not explicit.cache_hit
    again = _compile(_linear_gelu, inputs)
    assert again.cache_hit and again.folder == default.folder


# ------------------------------------------------------------------------------------- threads and sessions
def test_sessions_never_leave_threads_spinning_and_share_one_arena(cache_dir: Path) -> None:
    """What the session options say is what the session got (read back from ONNX Runtime): torch's thread
    count, no spinning between sections unless asked, spinning stopped when a run returns either way
    (an idle session takes no core from torch or another session), the process-wide CPU arena."""
    inputs = _linear_inputs()
    for options, spinning in (({}, "0"), ({"allow_spinning": True}, "1")):
        graph = _compile(_linear_gelu, inputs, **options)
        so = graph.session.get_session_options()
        assert so.intra_op_num_threads == torch.get_num_threads()
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == spinning
        assert so.get_session_config_entry("session.force_spinning_stop") == "1"
        assert so.get_session_config_entry("session.use_env_allocators") == "1"
        torch.testing.assert_close(graph(*inputs)[0], _linear_gelu(*inputs), atol=1e-5, rtol=1e-5)


def test_a_graph_compiled_twice_runs_on_one_session(cache_dir: Path) -> None:
    """One session per model file and settings in the process (one pool, one copy of the packed weights),
    kept only while a compiled graph holds it; other settings or another shape get their own."""
    inputs = _linear_inputs()
    first, second = _compile(_linear_gelu, inputs), _compile(_linear_gelu, inputs)
    assert first.session is second.session
    assert _compile(_linear_gelu, inputs, intra_op_num_threads=1).session is not first.session
    assert _compile(_linear_gelu, _linear_inputs(5)).session is not first.session
    for graph in (first, second):  # called in turn, each binds its own outputs
        torch.testing.assert_close(graph(*inputs)[0], _linear_gelu(*inputs), atol=1e-5, rtol=1e-5)
    session = weakref.ref(first.session)
    del first, second, graph
    gc.collect()
    assert session() is None  # no graph holds it: closed, not cached for ever


# ------------------------------------------------------------------------------------- shapes
def test_new_shape_exports_a_new_graph(cache_dir: Path, measured: list) -> None:
    """With dynamic=False graphs are specialized per shape: a new batch size is a new graph, exported and cached once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    compiled = torchmux.compile(model, backend="onnxruntime", dynamic=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)
        for batch in (4, 6, 4):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert len(list(cache_dir.iterdir())) == 2  # one session per shape
    # a compiled graph refuses a shape it was not built for (an error, never a wrong answer)
    graph = _compile(_linear_gelu, _linear_inputs(8))
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        graph(*_linear_inputs(5))


# ------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", ["mlp", "resnet", "bert", "gpt2"])
def test_zoo_model_matches_eager(name: str, measured: list) -> None:
    if zoo.ZOO[name].needs:
        pytest.importorskip(zoo.ZOO[name].needs)
    model, args = zoo.build(name, 2)
    start = len(measured)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)
        expected = zoo.tensors_of(model(*args))
        got = zoo.tensors_of(torchmux.compile(model, backend="onnxruntime")(*args))
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    ours = [m for m in measured[start:] if m[1] == "onnxruntime"]
    assert ours and all(ok for _, _, ok, _ in ours), ours


def test_training_forward_and_backward_graphs(measured: list) -> None:
    """Both AOTAutograd graphs run on onnxruntime (the backward one returns None for the input's
    gradient); gradients match eager across optimizer steps that change the weights in place."""
    import copy

    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(reference)
    compiled = torchmux.compile(model, backend="onnxruntime")
    x = torch.randn(8, 16)
    start = len(measured)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)
        for _ in range(2):
            reference(x).square().mean().backward()
            compiled(x).square().mean().backward()
            for p, q in zip(reference.parameters(), model.parameters()):
                torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4)
            with torch.no_grad():
                for p, q in zip(reference.parameters(), model.parameters()):
                    p -= 0.1 * p.grad
                    q -= 0.1 * q.grad
                    p.grad = q.grad = None
    ours = [m for m in measured[start:] if m[1] == "onnxruntime"]
    assert {m[0].rsplit("_", 1)[-1] for m in ours} == {"forward", "backward"} and all(m[2] for m in ours), ours


# ------------------------------------------------------------------------------------- failures
def test_unknown_provider_falls_back_to_eager(measured: list) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3 + 1

    compiled = torchmux.compile(
        fn, backend="onnxruntime", options={"onnxruntime.providers": ["NoSuchExecutionProvider"]}
    )
    x = torch.randn(5, 7)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="NoSuchExecutionProvider"):
        out = compiled(x)
    torch.testing.assert_close(out, fn(x))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where the CUDA provider cannot load")
def test_cuda_provider_without_gpu_falls_back_to_eager(cache_dir: Path) -> None:
    """ONNX Runtime itself fails to load its CUDA provider here (and would quietly use the CPU): compile
    raises, and torchmux runs the graph eagerly."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) - x

    compiled = torchmux.compile(fn, backend="onnxruntime", options={"onnxruntime.providers": [CUDA]})
    x = torch.randn(3, 9)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="could not enable CUDAExecutionProvider"):
        out = compiled(x)
    torch.testing.assert_close(out, fn(x))
    assert not any(cache_dir.glob("*/model.opt.onnx"))  # nothing optimized for the wrong provider is cached


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_iobinding_and_model(cache_dir: Path) -> None:
    from torchmux.backends.onnxruntime import built_providers

    if CUDA not in built_providers():
        pytest.skip(f"this onnxruntime build has no {CUDA} (install onnxruntime-gpu): {built_providers()}")
    inputs = [t.cuda() for t in _linear_inputs()]
    graph = _compile(_linear_gelu, inputs, providers=[CUDA, CPU])
    assert graph.providers[0] == CUDA
    out = graph(*inputs)[0]
    assert out.is_cuda
    torch.testing.assert_close(out, _linear_gelu(*inputs), atol=1e-4, rtol=1e-4)
    model, args = zoo.build("resnet", 2)
    model, args = model.cuda(), tuple(a.cuda() for a in args)
    with torch.no_grad():
        expected = model(*args)
        got = torchmux.compile(model, backend="onnxruntime", options={"onnxruntime.providers": [CUDA, CPU]})(*args)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


def _squeeze_nothing(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.relu(x).squeeze(2) * 2, x.squeeze(1).squeeze(2)  # dim 2 is 4: no-ops in torch; dim 1 is 1


def test_a_squeeze_of_a_dimension_that_is_not_one_squeezes_nothing(cache_dir: Path) -> None:
    """torch's ONNX translation refused ``aten.squeeze.dims`` of a dimension of size 4 (a no-op in torch),
    so such graphs ran eagerly; the ONNX model now squeezes the dimensions of size 1 only."""
    x = torch.rand(3, 1, 4, 5)
    graph = _compile(_squeeze_nothing, [x])
    for got, want in zip(graph(x), _squeeze_nothing(x)):
        torch.testing.assert_close(got, want)
