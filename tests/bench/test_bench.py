"""``torchmux bench`` end to end on the tiniest setting: real child processes, real compiles, real timings.

No timing is asserted (speed is the benchmark's business); the tests check that every figure is
there, that the outputs are written, and that a backend that kills its process is reported, not fatal.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from torchmux.bench import cli as bench
from torchmux.core.registry import get_registry

FIGURES = ("latency_ms", "speedup_vs_eager", "compile_s", "memory_mb", "matches_eager", "max_abs_diff")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, str]:
    out = tmp_path_factory.mktemp("bench")
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = bench.main(
            [
                "--models",
                "mlp",
                "--batch-size",
                "2",
                "--systems",
                "eager,torchmux:eager",
                "--rounds",
                "3",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
    return rc, out, text.getvalue()


def test_json_has_every_figure(small_run: tuple[int, Path, str]) -> None:
    rc, out, _ = small_run
    assert rc == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["complete"] is True
    assert report["settings"]["systems"] == ["eager", "torchmux:eager"]
    rows = report["models"]["mlp"]["systems"]
    for system in ("eager", "torchmux:eager"):
        row = rows[system]
        assert row["ok"], row["error"]
        for key in FIGURES:
            assert key in row, f"{system} lacks {key}"
        lat = row["latency_ms"]
        assert len(row["samples_ms"]) == 3
        # every warm-up call, unless a loaded machine ran the MLP past the warm-up's time limit first
        assert 0 < row["warm_up_calls"] <= report["settings"]["warm_up"]["calls"]
        assert lat["min"] <= lat["q1"] <= lat["median"] <= lat["q3"] <= lat["max"]
        assert row["matches_eager"] is True and row["max_abs_diff"] <= 1e-4
        assert row["memory_mb"]["kind"] == "rss" and row["memory_mb"]["peak"] > 50  # torch alone is more
        assert row["compile_s"]["cold"] > 0
    assert rows["eager"]["speedup_vs_eager"] == 1.0
    s = rows["torchmux:eager"]
    assert math.isclose(s["speedup_vs_eager"], rows["eager"]["latency_ms"]["median"] / s["latency_ms"]["median"])
    assert s["compile_s"]["warm"] > 0  # the second process on hot caches
    assert s["speedup_vs_inductor"] is None  # inductor was not run
    geo = report["geomean"]["torchmux:eager"]
    assert geo["speedup_vs_eager_models"] == 1 and math.isclose(geo["speedup_vs_eager"], s["speedup_vs_eager"])
    assert report["environment"]["torch"] and report["measures"]["memory_mb"]


def test_chart_is_a_png(small_run: tuple[int, Path, str]) -> None:
    _, out, _ = small_run
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "bench.png").stat().st_size > 5000


def test_table_prints(small_run: tuple[int, Path, str]) -> None:
    _, out, text = small_run
    assert "median ms" in text and "speedup vs eager" in text and "geomean" in text
    detail = next(line for line in text.splitlines() if line.strip().startswith("torchmux:eager"))
    assert "x" in detail and "yes" in detail  # a speedup and the output check
    assert str(out / "bench.json") in text


def test_from_json_redraws_without_running(
    small_run: tuple[int, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, text = small_run
    copy = tmp_path / "bench.json"
    copy.write_text((out / "bench.json").read_text())
    assert bench.main(["--from-json", str(copy)]) == 0
    printed = capsys.readouterr().out
    assert printed.split("\n\nwrote")[0] == text.split("\n\nwrote")[0]  # the same tables
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_model_lists_the_zoo(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = bench.main(["--models", "mlp,resnet50", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "'resnet50' not in the zoo" in err
    for name in ("mlp", "resnet", "bert", "gpt2", "t5_encoder", "vit", "attention", "rmsnorm_mlp", "pointwise"):
        assert name in err
    assert not (tmp_path / "bench.json").exists()


def test_bad_system_lists_the_systems(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert bench.main(["--models", "mlp", "--systems", "eager,nosuch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'nosuch' is not a system" in err and "torchmux:eager" in err and "inductor" in err


def test_default_systems() -> None:
    systems, skipped = bench.resolve_systems("default", "cpu")
    assert systems[0] == "eager" and "inductor" in systems and systems[-1] == "torchmux:auto"
    assert "torchmux:eager" not in systems  # eager is the eager system
    registry = get_registry()
    for name in registry.names:
        b = registry.get(name)
        if name != "eager" and not getattr(b, "auto", True):
            assert f"torchmux:{name}" not in systems and f"torchmux:{name}" in skipped  # e.g. interpreter-only triton
        if not registry.availability(name).ok:
            assert f"torchmux:{name}" not in systems


CRASHING_PLUGIN = '''
    """A real backend that kills its own process on the eighth call of a compiled graph in that process."""
    import os
    import signal

    import torchmux

    CALLS = [0]


    class Crashing(torchmux.Backend):
        name = "bench_crashing"
        auto = False  # never chosen unless named
        description = "test backend: dies on the eighth call"

        def compile(self, request):
            forward = request.ir.gm.forward

            def run(*args):
                CALLS[0] += 1
                if CALLS[0] == 8:
                    os.kill(os.getpid(), signal.SIGKILL)
                return list(forward(*args))

            return run


    @torchmux.hookimpl
    def torchmux_add_backends():
        return [Crashing()]
'''


@pytest.fixture
def crashing_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "bench_crashing_plugin.py").write_text(textwrap.dedent(CRASHING_PLUGIN))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("TORCHMUX_PLUGINS", "bench_crashing_plugin")
    monkeypatch.syspath_prepend(str(tmp_path))
    get_registry(reload=True)
    yield
    monkeypatch.undo()
    get_registry(reload=True)


def _latency_only(out: Path, systems: str, rounds: int, *extra: str) -> int:
    """``torchmux bench --latency-only`` on the MLP at batch 2 (no compile processes, to save time)."""
    return bench.main(
        ["--models", "mlp", "--batch-size", "2", "--systems", systems, "--rounds", str(rounds)]
        + ["--out", str(out), "--no-progress", "--latency-only", *extra]
    )


def test_a_backend_that_kills_the_process_is_reported(crashing_backend: None, tmp_path: Path) -> None:
    """The latency process (torchmux's first call checks the answer: 3 calls; warm-up and calibration:
    2 more; then at least one per round) dies while timing the crashing backend; it is run again
    without it, and eager still gets its figures. (--latency-only: no compile processes, to save time.)"""
    out = tmp_path / "out"
    rc = _latency_only(out, "eager,bench_crashing", 10)
    assert rc == 0
    rows = json.loads((out / "bench.json").read_text())["models"]["mlp"]["systems"]
    assert rows["eager"]["ok"] and rows["eager"]["latency_ms"]["median"] > 0
    assert rows["eager"]["compile_s"]["in_bench"] is not None and "memory_mb" not in rows["eager"]
    crashed = rows["torchmux:bench_crashing"]
    assert not crashed["ok"]
    assert "SIGKILL while timing it" in crashed["error"]
    assert (out / "logs" / "mlp.latency.2.log").exists()  # the second attempt, without it


def test_per_system_latency_processes_time_each_system_alone(crashing_backend: None, tmp_path: Path) -> None:
    """``--latency-processes per-system``: each system in a process of its own, all driven through the
    same rounds. The crashing backend's process dies while it warms up (its eighth call); it is
    reported with the signal, and eager, in its own process, gets a sample in every round."""
    out = tmp_path / "out"
    rc = _latency_only(out, "eager,bench_crashing,onnxruntime-export", 4, "--latency-processes", "per-system")
    assert rc == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["settings"]["latency_processes"] == "per-system"
    rows = report["models"]["mlp"]["systems"]
    for system in ("eager", "onnxruntime-export"):
        assert rows[system]["ok"] and rows[system]["latency_ms"]["n"] == 4, rows[system]
        assert (out / "logs" / f"mlp.{system}.latency.log").exists()  # a process of its own
    assert rows["onnxruntime-export"]["matches_eager"] is True
    crashed = rows["torchmux:bench_crashing"]
    assert not crashed["ok"]
    assert "SIGKILL while warming up it" in crashed["error"], crashed["error"]


def test_processes_per_system_pool_their_samples(crashing_backend: None, tmp_path: Path) -> None:
    """``--processes-per-system 2``: two processes for each system, each compiled on its own; eager's
    samples are pooled over both (a sample from each in every round), each process's median kept; the
    crashing backend fails in both, and is reported failed."""
    out = tmp_path / "out"
    extra = ("--latency-processes", "per-system", "--processes-per-system", "2")
    rc = _latency_only(out, "eager,bench_crashing", 3, *extra)
    assert rc == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["settings"]["processes_per_system"] == 2
    eager = report["models"]["mlp"]["systems"]["eager"]
    assert eager["ok"] and eager["latency_ms"]["n"] == 6 and len(eager["process_medians_ms"]) == 2, eager
    assert (out / "logs" / "mlp.eager.latency.log").exists() and (out / "logs" / "mlp.eager.latency.2.log").exists()
    crashed = report["models"]["mlp"]["systems"]["torchmux:bench_crashing"]
    assert not crashed["ok"] and "SIGKILL while warming up it" in crashed["error"], crashed["error"]


def test_processes_of_one_system_join_checks_and_choices() -> None:
    """A system's processes as one row: it matches eager only where every process did, the worst
    difference is kept, and a graph its auto processes placed differently reads ``a/b``."""
    from torchmux.bench.cli import _joined

    rows = [
        {
            "event": "compiled",
            "matches": True,
            "max_abs_diff": 0.0,
            "mismatch": None,
            "auto_choices": {"g": "onnxruntime"},
        },
        {
            "event": "compiled",
            "matches": False,
            "max_abs_diff": 2.0,
            "mismatch": "output 0",
            "auto_choices": {"g": "inductor"},
        },
        {
            "event": "compiled",
            "matches": True,
            "max_abs_diff": 0.5,
            "mismatch": None,
            "auto_choices": {"g": "onnxruntime"},
        },
    ]
    row = _joined(rows)
    assert (row["matches"], row["max_abs_diff"], row["mismatch"]) == (False, 2.0, "output 0")
    assert row["auto_choices"] == {"g": "inductor/onnxruntime"}
    assert _joined(rows[:1]) == rows[0] and _joined(rows[:1]) is not rows[0]


def test_processes_per_system_needs_per_system_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = _latency_only(tmp_path / "out", "eager", 2, "--processes-per-system", "3")
    assert rc == 2
    assert "--processes-per-system needs --latency-processes per-system" in capsys.readouterr().err


def test_assemble_reports_failures_and_geomean_skips_wrong_answers() -> None:
    """The parent's bookkeeping on hand-written child results (no processes): a failed compile, a
    wrong answer, speedups against eager and inductor, and a table that shows all of it."""
    from torchmux.bench.report import format_report

    def lat(ms: float, matches: bool = True) -> dict:
        return {
            "event": "compiled",
            "compile_s": 0.5,
            "matches": matches,
            "max_abs_diff": 0.0 if matches else 3.0,
            "mismatch": None if matches else "output 0: 5 of 8 elements outside tolerance",
            "notes": [],
            "calls_per_sample": 1,
            "samples": [ms / 1e3] * 3,
        }

    systems = ["eager", "inductor", "torchmux:onnxruntime", "torchmux:auto"]
    cold = {
        s: {"ok": True, "first_call_s": 2.0, "notes": [], "rss_before_mb": 300.0, "peak_rss_mb": 400.0} for s in systems
    }
    cold["torchmux:onnxruntime"] = {"ok": False, "error": "the process died of signal SIGSEGV: (no output)"}
    latency = {"systems": {"eager": lat(4.0), "inductor": lat(2.0), "torchmux:auto": lat(1.0, matches=False)}}
    row = bench.assemble("mlp", systems, cold, {}, latency, "cpu")
    rows = row["systems"]
    assert rows["inductor"]["speedup_vs_eager"] == 2.0 and rows["eager"]["speedup_vs_inductor"] == 0.5
    assert rows["torchmux:auto"]["speedup_vs_inductor"] == 2.0 and rows["torchmux:auto"]["matches_eager"] is False
    assert not rows["torchmux:onnxruntime"]["ok"] and "SIGSEGV" in rows["torchmux:onnxruntime"]["error"]
    assert rows["inductor"]["memory_mb"] == {"peak": 400.0, "delta": 100.0, "kind": "rss"}
    models = {"mlp": row}
    geo = bench.geomeans(models, systems)
    assert geo["inductor"]["speedup_vs_eager"] == 2.0
    assert geo["torchmux:auto"]["speedup_vs_eager"] is None  # a wrong answer is no speedup
    report = {
        "environment": {"device": "cpu", "device_name": "test cpu", "cpu_count": 2, "threads": 2, "torch": "x"},
        "settings": {"systems": systems, "models": ["mlp"], "batch_size": 8, "rounds": 3, "skipped_systems": {}},
        "wall_s": 1.0,
        "complete": True,
        "models": models,
        "geomean": geo,
    }
    text = format_report(report)
    assert "SIGSEGV" in text and "NO (3)" in text and "failed" in text and "(wrong)" in text


def test_auto_split_is_a_system_of_its_own() -> None:
    systems, _ = bench.resolve_systems("auto,auto-split", "cpu")
    assert systems == ["eager", "torchmux:auto", "torchmux:auto-split"]


def test_auto_is_reported_against_the_fastest_single_system() -> None:
    """auto_vs_best on hand-written results: the best single system per model (wrong answers and
    autos excluded), auto's ratio to it, and the geomeans; the table across settings shows both."""
    from torchmux.bench.report import auto_table, format_report
    from torchmux.bench.results import auto_vs_best

    def lat(ms: float, matches: bool = True) -> dict:
        return {
            "event": "compiled",
            "compile_s": 0.5,
            "matches": matches,
            "max_abs_diff": 0.0,
            "mismatch": None,
            "notes": [],
            "calls_per_sample": 1,
            "samples": [ms / 1e3] * 3,
            "auto_choices": {"graph_0": "onnxruntime"},
        }

    systems = ["eager", "inductor", "inductor-freezing", "onnxruntime-export", "torchmux:auto"]
    cold = {s: {"ok": True, "first_call_s": 1.0, "notes": []} for s in systems}
    models = {
        "mlp": bench.assemble(
            "mlp",
            systems,
            cold,
            {},
            {
                "systems": {
                    "eager": lat(4.0),
                    "inductor": lat(2.0),
                    "inductor-freezing": lat(1.0, matches=False),
                    "onnxruntime-export": lat(1.6),
                    "torchmux:auto": lat(1.5),
                }
            },
            "cpu",
        ),
        "resnet": bench.assemble(
            "resnet",
            systems,
            cold,
            {},
            {
                "systems": {
                    "eager": lat(4.0),
                    "inductor": lat(2.0),
                    "inductor-freezing": lat(1.0),
                    "onnxruntime-export": lat(3.0),
                    "torchmux:auto": lat(2.0),
                }
            },
            "cpu",
        ),
    }
    report = {
        "environment": {"device": "cpu", "device_name": "test cpu", "cpu_count": 2, "threads": 1, "torch": "x"},
        "settings": {"systems": systems, "models": list(models), "batch_size": 1, "rounds": 3, "skipped_systems": {}},
        "wall_s": 1.0,
        "complete": True,
        "models": models,
        "geomean": bench.geomeans(models, systems),
    }
    cmp = auto_vs_best(report)
    assert cmp["models"]["mlp"]["best"] == "onnxruntime-export"  # inductor-freezing answered wrong
    assert cmp["models"]["mlp"]["auto_over_best"] == pytest.approx(1.5 / 1.6)
    assert cmp["models"]["resnet"]["best"] == "inductor-freezing" and cmp["models"]["resnet"]["auto_over_best"] == 2.0
    assert cmp["auto_over_best_geomean"] == pytest.approx((1.5 / 1.6 * 2.0) ** 0.5)
    # against each system over the models where both matched: inductor-freezing only on resnet
    assert cmp["auto_over_system_geomean"]["inductor-freezing"] == pytest.approx(2.0)
    assert cmp["best_single"] == "inductor-freezing"
    text = format_report(report)
    assert "auto against the fastest single system" in text and "2.00x SLOWER" in text
    table = "\n".join(auto_table({"1 thread(s), batch 1": report, "2 thread(s), batch 8": report}))
    assert "0.94x (onnxruntime-export)" in table and "2 thread(s), batch 8" in table


def test_outside_systems_are_in_the_default_set_and_the_export_system_runs() -> None:
    """inductor-freezing and onnxruntime-export are contenders by default; the export system is ONNX
    Runtime used directly (a real export and session) and answers as eager does."""
    import torch

    from torchmux.bench.run import make_compiled

    systems, _ = bench.resolve_systems("default", "cpu")
    assert "inductor-freezing" in systems
    if "onnxruntime" not in get_registry().names or not get_registry().availability("onnxruntime").ok:
        pytest.skip("onnxruntime is not available")
    assert "onnxruntime-export" in systems
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval(), torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(make_compiled("onnxruntime-export", model, 1)(x), model(x))


def test_reduce_overhead_is_a_cuda_contender_and_left_out_on_a_cpu_with_its_reason() -> None:
    """torch.compile(mode="reduce-overhead") (CUDA graphs) is in the default set on CUDA and runs when named there; named on a CPU it
    is left out with a reason rather than run as plain Inductor under another name."""
    cuda, _ = bench.resolve_systems("default", "cuda")
    cpu, _ = bench.resolve_systems("default", "cpu")
    assert "inductor-reduce-overhead" in cuda and "inductor-reduce-overhead" not in cpu
    systems, skipped = bench.resolve_systems("eager,inductor-reduce-overhead", "cpu")
    assert systems == ["eager"]
    assert "--device cuda" in skipped["inductor-reduce-overhead"]
    # named on CUDA it runs (it was refused as 'not a system' there until the H200 run of 2026-11-27)
    systems, skipped = bench.resolve_systems("eager,inductor-reduce-overhead", "cuda")
    assert systems == ["eager", "inductor-reduce-overhead"] and not skipped


def test_tvm_used_directly_is_a_system_named_on_a_cpu_and_answers_as_eager() -> None:
    """tvm-export is TVM as its users run it (a real torch.export, TVM frontend, tvm.compile and Relax VM):
    named on a CPU it runs and answers as eager does; it is not in the default set (untuned, it loses by
    10-50x here) and is left out with a reason on CUDA."""
    import torch

    from torchmux.bench.run import make_compiled

    default, _ = bench.resolve_systems("default", "cpu")
    assert "tvm-export" not in default
    systems, skipped = bench.resolve_systems("eager,tvm-export", "cuda")
    assert systems == ["eager"] and "CPU" in skipped["tvm-export"]
    if not get_registry().availability("tvm").ok:
        pytest.skip("tvm is not available")
    systems, skipped = bench.resolve_systems("eager,tvm-export", "cpu")
    assert systems == ["eager", "tvm-export"] and not skipped
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval(), torch.randn(2, 8)
    compiled = make_compiled("tvm-export", model, 1)
    with torch.no_grad():
        for _ in range(2):  # built at the first call, then the same VM
            torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.gpu
def test_reduce_overhead_system_answers_as_eager_on_cuda() -> None:
    import torch

    from torchmux.bench.run import make_compiled

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).cuda().eval()
    x = torch.randn(2, 8, device="cuda")
    compiled = make_compiled("inductor-reduce-overhead", model)
    with torch.no_grad():
        for _ in range(3):  # recorded, then replayed
            torch.testing.assert_close(compiled(x).clone(), model(x))


def test_a_package_system_and_a_footnote_for_ops_left_on_eager() -> None:
    """torchmux-export:<backend> is a package saved and loaded back; a torchmux system whose backend left
    ops to eager gets a footnote naming them (the example plugin claims relu, not addmm)."""
    import torch

    import torchmux
    from torchmux.bench.run import _AutoChoices, make_compiled

    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(), torch.randn(2, 8)
    with torch.no_grad():
        package = make_compiled("torchmux-export:eager", model, 1)
        torch.testing.assert_close(package(x), model(x))
        assert package.loaded.backend == "eager"  # loaded with torchmux.load, no Dynamo in the call
        if "example" not in get_registry().names:
            pytest.skip("the example plugin is not installed")
        recorder = _AutoChoices.install()
        try:
            torchmux.compile(model, backend="example")(x)
        finally:
            recorder.active = False
    (note,) = recorder.eager_notes()
    assert "example: " in note and "aten.addmm.default" in note and "ops eager" in note


def test_varying_shapes_workload_reports_total_time_and_compiles(tmp_path: Path) -> None:
    """``--workload varying-shapes`` on three sizes: every call answered, compiles counted per backend."""
    import contextlib
    import io

    from torchmux.bench.varying import sizes

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        rc = bench.main(
            ["--workload", "varying-shapes", "--models", "mlp", "--calls", "3", "--systems", "eager,torchmux:eager"]
            + ["--out", str(tmp_path), "--no-progress"]
        )
    assert rc == 0
    report = json.loads((tmp_path / "varying.json").read_text())
    assert report["settings"]["calls"] == 3 and len(set(sizes(False, 3, 13))) == 3  # three distinct sizes
    rows = report["models"]["mlp"]
    for system in ("eager", "torchmux:eager"):
        assert rows[system]["ok"], rows[system].get("error")
        assert rows[system]["total_s"] > 0 and rows[system]["matches_eager"] and rows[system]["calls"] == 3
    # the first size's static graph, then one symbolic graph for the other two sizes
    assert rows["torchmux:eager"]["compiles"] == {"eager": 2} and rows["torchmux:eager"]["graphs_captured"] == 2
    assert not rows["torchmux:eager"]["fallback_warnings"]
    assert "torchmux:eager" in text.getvalue() and "compiles per backend" in text.getvalue()


def test_aoti_probe_names_the_step_a_failing_child_reached_and_prints_its_tail(tmp_path: Path) -> None:
    """bench/scripts/aoti_probe.py runs each variant in a child; one that fails is reported with its exit
    status, the last step it reached and the tail of what it wrote (here: a model the zoo lacks)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "torchmux.bench.scripts.aoti_probe", "--device", "cpu", "--model", "no_such_model"]
        + ["--variants", "docs", "--out", str(tmp_path), "--seconds", "120"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "docs: exit status 1" in done.stdout and "last step: none" in done.stdout
    assert "unknown model 'no_such_model'" in done.stdout  # the child's traceback, printed under its line
    assert "unknown model" in (tmp_path / "aoti-docs.txt").read_text()


@pytest.mark.slow
def test_aoti_probe_runs_the_docs_steps_to_the_end_on_a_cpu(tmp_path: Path) -> None:
    """The probe's variants pass on a CPU (AOTInductor with g++): a real export, compile, load and two
    calls each, within float rounding of eager; so a GPU session spends its minutes on the GPU's answer."""
    from torchmux.bench.scripts import aoti_probe

    assert aoti_probe.main(["--device", "cpu", "--variants", "constants_outside", "--out", str(tmp_path)]) == 0
    log = (tmp_path / "aoti-constants_outside.txt").read_text()
    assert "step: load_constants" in log and "step: ok" in log
    diffs = [float(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "max |diff|" in line]
    assert len(diffs) == 2 and max(diffs) < 1e-4


@pytest.mark.slow
def test_aoti_probe_exports_through_torchmux_naming_each_candidate(tmp_path: Path) -> None:
    """The probe's torchmux variants: a real ``torchmux.export`` of the zoo's MLP, each candidate's row of
    the plan printed as a step (where a GPU child dies, its crash site is there), then the package saved,
    loaded back and called twice within float rounding of eager."""
    from torchmux.bench.scripts import aoti_probe

    assert aoti_probe.main(["--device", "cpu", "--variants", "torchmux_inductor", "--out", str(tmp_path)]) == 0
    log = (tmp_path / "aoti-torchmux_inductor.txt").read_text()
    assert "step: candidate inductor: ok" in log and "step: torchmux.load (inductor)" in log, log[-2000:]
    diffs = [float(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "max |diff|" in line]
    assert len(diffs) == 2 and max(diffs) < 1e-4 and "step: ok" in log


def test_aoti_probe_prints_the_loader_trace_of_a_process_that_died(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--ld-debug``: the dynamic loader's trace of a process killed by SIGSEGV (no 'calling fini' at its
    end) is printed, its last lines the libraries it had opened; one that exited is not."""
    import os
    import subprocess
    import sys

    from torchmux.bench.scripts.aoti_probe import _print_unfinished

    env = {**os.environ, "LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(tmp_path / "ld-v")}
    died = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"], env=env, check=False)
    lived = subprocess.run([sys.executable, "-c", "import ctypes"], env=env, check=False)
    assert died.returncode == -11 and lived.returncode == 0
    _print_unfinished(tmp_path, "v")
    out = capsys.readouterr().out
    assert out.count("(no exit)") == 1 and "_ctypes" in out, out
