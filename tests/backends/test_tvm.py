"""The TVM backend: real Relax imports, real LLVM builds, real MetaSchedule trials, real subprocesses.

The conformance suite (tests/conformance) covers the ops it claims; these tests cover the rest:
availability and version reporting, the DLPack hot path, the disk cache across processes, new shapes,
tuning records written and reused, and zoo models against eager.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import torchmux
from torchmux.bench import zoo
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace

if not get_registry().availability("tvm").ok:
    pytest.skip(f"tvm backend unavailable: {get_registry().availability('tvm').reason}", allow_module_level=True)

from torchmux.backends.tvm import TvmBackend  # noqa: E402

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b)).softmax(-1)


def _linear_inputs(batch: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(batch, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)]


def _compile(fn, inputs, mode=None, **options):  # type: ignore[no-untyped-def]
    ir = trace(fn, inputs, name="t")
    return ir, get_registry().get("tvm").compile(torchmux.CompileRequest(ir, inputs, mode, options))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of this test's own (inherited by the subprocesses it starts)."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    return tmp_path / "tvm"


@pytest.fixture(scope="module")
def measured() -> list[tuple[str, str, bool, str]]:
    """Every (graph, backend, ok, reason) the autotuner reports while this module runs."""
    seen: list[tuple[str, str, bool, str]] = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):  # type: ignore[no-untyped-def]
            seen.append((ir.name, backend, ok, reason))

    registry = get_registry()
    registry.register(Observer(), "test_tvm_observer")
    yield seen
    registry.pm.unregister(name="test_tvm_observer")


# ------------------------------------------------------------------------------------- availability
def test_availability_reports_the_installed_version() -> None:
    info = {b.name: b for b in torchmux.list_backends()}["tvm"]
    assert info.available and info.version == importlib.metadata.version("apache-tvm")
    missing = type("Missing", (TvmBackend,), {"package": "apache-tvm-not-installed-here"})()
    why = missing.availability()
    assert not why.ok and "pip install apache-tvm" in why.reason


def test_import_torchmux_does_not_import_tvm() -> None:
    code = "import sys, torchmux; torchmux.list_backends(); print('tvm' in sys.modules)"
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_unknown_option_is_an_error_that_lists_the_options(cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="tune_seconds"):
        _compile(_linear_gelu, _linear_inputs(), tune_second=3)


# ------------------------------------------------------------------------------------- hot path
def test_dlpack_path_strided_inputs_mixed_dtypes_and_fresh_outputs(cache_dir: Path) -> None:
    """Inputs cross by DLPack (a transposed view is made compact first); outputs are torch tensors of
    the graph's dtypes that a later call does not overwrite."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x @ w
        return y, y.argmax(-1), y.sum() > 0

    x, w = torch.randn(5, 8), torch.randn(6, 8).t()  # w is a non-contiguous view
    ir, run = _compile(fn, [x, w])
    first = run(x, w)
    assert [t.dtype for t in first] == [torch.float32, torch.int64, torch.bool]
    assert all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in first)
    for got, ref in zip(first, ir.run_reference(x, w)):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    kept = first[0].clone()
    run(x * 3, w)
    torch.testing.assert_close(first[0], kept)  # the second call did not write into the first's output
    # a graph built for one shape refuses another: an error, never a wrong answer
    with pytest.raises(Exception):
        run(torch.randn(7, 8), w)


# ------------------------------------------------------------------------------------- disk cache
_CHILD = textwrap.dedent(
    """
    import json, time, torch, torch.nn.functional as F, torchmux
    from torchmux.core.registry import get_registry
    from torchmux.core.trace import trace

    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b)).softmax(-1)

    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)]
    ir = trace(fn, inputs, name="t")
    run = get_registry().get("tvm").compile(torchmux.CompileRequest(ir, inputs))
    err = (run(*inputs)[0] - fn(*inputs)).abs().max().item()
    info = run.tvm_info
    print(json.dumps({"cache": info.cache, "build": info.build_seconds, "library": info.library, "err": err}))
    """
)


def test_disk_cache_hit_in_a_new_process(cache_dir: Path) -> None:
    """The library built here is loaded, not rebuilt, by a second process compiling the same graph."""
    ir, run = _compile(_linear_gelu, _linear_inputs())
    info = run.tvm_info
    assert info.cache == "miss" and info.build_seconds > 0
    library = Path(info.library)
    assert library.parent == cache_dir / "lib" and library.exists()
    meta = json.loads(library.with_suffix(".json").read_text())
    import tvm

    assert meta["fingerprint"] == ir.fingerprint() and meta["tvm"] == tvm.__version__
    stamp = library.stat().st_mtime_ns
    out = subprocess.run([PY, "-c", _CHILD], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["cache"] == "hit" and child["build"] == 0 and child["library"] == str(library), child
    assert child["err"] < 1e-5
    assert library.stat().st_mtime_ns == stamp  # nothing rewritten


# ------------------------------------------------------------------------------------- shapes
def test_new_shape_builds_a_new_library(cache_dir: Path, measured: list) -> None:
    """Graphs are specialized per shape (compile(dynamic=False)): each batch size is its own graph,
    fingerprint and cached library; a shape seen before reuses its build."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    compiled = torchmux.compile(model, backend="tvm", dynamic=False)
    start = len(measured)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", torchmux.TorchmuxFallbackWarning)
        for batch in (4, 6, 4):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    assert len(list((cache_dir / "lib").glob("*.so"))) == 2  # one library per shape
    ours = [m for m in measured[start:] if m[1] == "tvm"]
    assert len(ours) == 2 and all(ok for _, _, ok, _ in ours), ours


# ------------------------------------------------------------------------------------- tuning
def test_max_autotune_records_and_reuses_tuning(cache_dir: Path) -> None:
    """A tiny MetaSchedule budget measures real trials and persists their records; a second build of
    the same kernels (library cache off, so it really builds again) reuses them without tuning."""
    budget = {"tune_trials": 8, "trials_per_round": 2, "tune_trials_per_task": 2, "tune_seconds": 60.0}
    inputs = _linear_inputs()
    ir, run = _compile(_linear_gelu, inputs, "max-autotune", **budget)
    first = run.tvm_info
    assert first.tuned and first.tasks > 0 and first.trials > 0 and first.tasks_tuned == first.tasks, first
    torch.testing.assert_close(run(*inputs)[0], ir.run_reference(*inputs)[0], atol=1e-5, rtol=1e-5)
    records = list((cache_dir / "tuning").glob("*/records.json"))
    assert len(records) == 1
    workloads = json.loads(records[0].read_text())["workloads"]
    assert sum(len(w["records"]) for w in workloads.values()) > 0
    assert all(w["trials"] >= 2 for w in workloads.values())

    _, again = _compile(_linear_gelu, inputs, "max-autotune", cache=False, **budget)
    second = again.tvm_info
    assert second.trials == 0 and second.tasks_tuned == 0 and second.tasks_reused == first.tasks, second
    torch.testing.assert_close(again(*inputs)[0], ir.run_reference(*inputs)[0], atol=1e-5, rtol=1e-5)
    # the tuned library is its own artifact: tuning options are part of the key
    _, plain = _compile(_linear_gelu, inputs)
    assert plain.tvm_info.key != first.key


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
        got = zoo.tensors_of(torchmux.compile(model, backend="tvm")(*args))
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
    ours = [m for m in measured[start:] if m[1] == "tvm"]
    assert ours and all(ok for _, _, ok, _ in ours), ours


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_build_matches_eager(cache_dir: Path) -> None:
    inputs = [t.cuda() for t in _linear_inputs()]
    ir, run = _compile(_linear_gelu, inputs)
    assert '"cuda"' in run.tvm_info.target
    out = run(*inputs)
    assert out[0].is_cuda
    torch.testing.assert_close(out[0], ir.run_reference(*inputs)[0], atol=1e-4, rtol=1e-4)


def _token_and_position(x: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor, positions: torch.Tensor):
    """A BERT's embeddings in small: position ids are a slice of a longer buffer, ``positions[:, :seq]``."""
    return F.embedding(x, tok) + F.embedding(positions[:, : x.shape[1]], pos)


def test_symbolic_slice_of_a_longer_buffer_keeps_the_size_torch_proved():
    """Relax sizes ``positions[:, :s]`` as ``min(s, 16)`` unless told the slice is in bounds; the add
    with the ``s``-long token embedding then had no shape and TVM refused to build the graph."""
    from torchmux.testing.check import check_sizes, symbolic_calls

    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(10, 4, generator=g), torch.randn(16, 4, generator=g), torch.arange(16).unsqueeze(0)]
    sizes = [[torch.randint(0, 10, (1, n), generator=g), *weights] for n in (5, 11)]
    ir, calls = symbolic_calls(_token_and_position, sizes, "positions")
    assert check_sizes(get_registry().get("tvm"), ir, calls) is None


def _last_step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[:, -1, :] * 2, x.select(0, -2) + 1  # an RNN's last step; a select counted from the end


def test_select_counted_from_the_end_reads_inside_the_tensor(cache_dir: Path) -> None:
    """TVM's converter handed ``x[:, -1]``'s index to ``take`` in its unchecked mode, which read before the
    tensor (a BiRNN from ParityBench answered 2.8e22 on TVM; the check caught it and eager ran it)."""
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    _, compiled = _compile(_last_step, [x])
    for got, want in zip(compiled(x), _last_step(x)):
        torch.testing.assert_close(got, want)


def _gathered(x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x[:, idx] * 2, x[idx, idx] + 1, idx * 3  # the index read raw too


def test_index_tensor_counted_from_the_end_reads_inside_the_tensor(cache_dir: Path) -> None:
    """The same for ``x[:, idx]`` with negative entries in ``idx`` (TVM took them unchecked too)."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([-1, 0, 2, -3])
    _, compiled = _compile(_gathered, [x, idx])
    for got, want in zip(compiled(x, idx), _gathered(x, idx)):
        torch.testing.assert_close(got, want)
