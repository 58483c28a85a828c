"""The fault suite: backends that misbehave on purpose, bad cache records, bad arguments.

Each case ends in eager's answer (or the user's own exception) and a clear TorchmuxFallbackWarning.
The backends are real plugin code (faulty_backends.py, registered with torchmux.register_plugin);
the aborting, segfaulting and hanging ones run only under isolation (a real child process).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import torchmux
from torchmux.autotune import decisions, isolate
from torchmux.core.errors import BadArgumentError, TorchmuxFallbackWarning
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace

sys.path.insert(0, os.path.dirname(__file__))  # faulty_backends: importable here and in a trial's child
import faulty_backends


@pytest.fixture(autouse=True)
def plugins():
    if "fault_wrong_late" not in get_registry().names:
        torchmux.register_plugin(faulty_backends, "faulty_backends")
    torch._dynamo.reset()
    yield


def f(x):
    return torch.relu(x) * 2 + 1


def x_(seed=0):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))


def run_calls(backend, inputs, **options):
    """Compile f on ``backend`` and call it on each input; returns outputs and the fallback warnings."""
    compiled = torchmux.compile(f, backend=backend, options=options or None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled(x) for x in inputs]
    return outs, [w for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]


def assert_eager(outs, inputs):
    for o, x in zip(outs, inputs):
        torch.testing.assert_close(o, f(x), equal_nan=True)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("fault_wrong_late", "wrong answer"),
        ("fault_raises_5th", "raised RuntimeError"),
    ],
)
def test_late_faults_are_caught_and_demoted(name, reason):
    inputs = [x_(i) for i in range(8)]
    outs, warned = run_calls(name, inputs)
    assert_eager(outs, inputs)
    assert len(warned) == 1 and reason in str(warned[0].message) and name in str(warned[0].message)
    assert warned[0].filename == __file__  # points at the user's line, not threading.py


def test_wrong_on_nan_is_caught_on_the_first_nan_input():
    inputs = [x_(0), x_(1), x_(2)]
    inputs[2][0, 0] = math.nan
    outs, warned = run_calls("fault_wrong_nan", inputs)
    assert_eager(outs, inputs)
    assert len(warned) == 1 and "NaN" in str(warned[0].message)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("fault_mutates_input", "changed its input 0"),
        ("fault_aliases_input", "input"),
        ("fault_reuses_buffer", "reused output buffers"),
    ],
)
def test_inputs_and_buffers_are_part_of_the_answer(name, reason):
    x = x_(0)
    kept = x.clone()
    outs, warned = run_calls(name, [x, x_(1)])
    torch.testing.assert_close(x, kept)  # the trial never touched the user's tensor
    assert_eager(outs, [kept, x_(1)])
    assert outs[0].data_ptr() != outs[1].data_ptr()
    assert len(warned) == 1 and reason in str(warned[0].message)


def test_demotion_is_remembered_on_disk():
    run_calls("fault_wrong_late", [x_(i) for i in range(3)])
    torch._dynamo.reset()
    outs, warned = run_calls("fault_wrong_late", [x_(0)])
    assert_eager(outs, [x_(0)])
    assert len(warned) == 1 and "demoted earlier" in str(warned[0].message)


def test_verify_off_trusts_and_always_checks():
    inputs = [x_(i) for i in range(3)]
    outs, _ = run_calls("fault_wrong_late", inputs, verify="always", isolate="off")
    assert_eager(outs, inputs)
    with pytest.raises(BadArgumentError, match="verify"):
        torchmux.compile(f, options={"verify": "sometimes"})


@pytest.mark.parametrize(
    "name, reason",
    [
        ("fault_abort", "crashed with signal 6"),
        ("fault_segfault", "crashed with signal 11"),
        ("fault_hang_call", "timed out after 3 s"),
        ("fault_hang_compile", "timed out after 3 s"),
    ],
)
def test_crashes_and_hangs_stay_in_the_child(name, reason):
    before = isolate._SERVER.trials
    outs, warned = run_calls([name], [x_(0)], trial_deadline=3.0)
    assert_eager(outs, [x_(0)])
    assert any(reason in str(w.message) for w in warned) or not warned  # auto warns only when verbose
    assert isolate._SERVER.trials == before + 1
    torch._dynamo.reset()
    run_calls([name], [x_(0)], trial_deadline=3.0)  # the verdict is on disk: no second trial
    assert isolate._SERVER.trials == before + 1
    record = [json.loads(p.read_text()) for p in (torchmux.core.settings.CACHE_DIR.get() / "trials").glob("*.json")]
    assert any(r["backend"] == name and reason in r["reason"] for r in record)


def test_observer_that_raises_is_named_and_the_others_run():
    seen = []

    class Good:
        @staticmethod
        @torchmux.hookimpl
        def torchmux_graph_captured(ir):
            seen.append(ir.name)

    torchmux.register_plugin(faulty_backends.RaisingObserver(), "raising_observer")
    torchmux.register_plugin(Good(), "good_observer")
    try:
        with pytest.warns(UserWarning, match="raising_observer"):
            get_registry().notify("torchmux_graph_captured", ir=trace(f, [x_(0)]))
        assert seen
    finally:
        get_registry().pm.unregister(name="raising_observer")
        get_registry().pm.unregister(name="good_observer")


@pytest.mark.parametrize(
    "record",
    [
        '"a string"',
        "[]",
        '{"measurements": []}',
        '{"backend": 3}',
        '{"backend": "eager", "measurements": [{"seconds": 1}]}',
        '{"backend": "eager", "measurements": [{"backend": "eager", "seconds": "fast"}]}',
        "{not json",
    ],
)
def test_bad_decision_records_are_set_aside(record):
    path = decisions._path("0" * 32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record)
    assert decisions.load("0" * 32) is None
    assert not path.exists() and path.with_name(path.name + ".bad").exists()


def test_bad_decision_record_under_auto_is_remeasured(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    compiled = torchmux.compile(f, backend=["eager", "fault_wrong_nan"], options={"isolate": "off"})
    compiled(x_(0))
    for p in (tmp_path / "decisions").glob("*.json"):
        p.write_text('{"backend": ["not", "a", "name"]}')
    torch._dynamo.reset()
    compiled = torchmux.compile(f, backend=["eager", "fault_wrong_nan"], options={"isolate": "off"})
    with pytest.warns(TorchmuxFallbackWarning, match="not valid"):
        assert_eager([compiled(x_(0))], [x_(0)])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"autotune_budget": math.inf}, "finite"),
        ({"autotune_budget": math.nan}, "finite"),
        ({"autotune_budget": -1}, ">= 0"),
        ({"split": -2}, ">= 0"),
        ({"onnxruntime.providers": "CPUExecutionProvider"}, "list"),
        ({"onnxruntime.providers": [3]}, "list"),
        ({"isolate": "sometimes"}, "isolate"),
        ({"trial_deadline": 0}, "> 0"),
    ],
)
def test_bad_arguments_are_refused_at_compile(options, match):
    with pytest.raises(BadArgumentError, match=match):
        torchmux.compile(f, options=options)


def test_numpy_input_keeps_eagers_type_error():
    compiled = torchmux.compile(f, backend="eager")
    with pytest.raises(TypeError):
        f(np.ones((4, 8), dtype=np.float32))
    with pytest.raises(TypeError):
        compiled(np.ones((4, 8), dtype=np.float32))


def test_random_graphs_compare_shapes_not_values():
    def g(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    ir = trace(g, [x_(0)])
    from torchmux.autotune import verify

    assert verify.is_random(ir)
    assert verify.compare(ir, [torch.zeros(4, 8)], [torch.ones(4, 8)]) is None
    assert "shapes compared" in verify.compare(ir, [torch.zeros(4, 9)], [torch.ones(4, 8)])
    assert os.environ.get("TORCHMUX_CACHE_DIR")


def test_a_check_runs_its_reference_on_one_torch_thread():
    """A check inside the user's call runs the graph's ATen ops on one torch thread (no OpenMP barrier
    to stall on a busy machine, no workers left spinning against the backend's calls), then gives the
    program its thread count back, also when the reference raises."""
    from torchmux.autotune import verify

    ir = trace(lambda x: (x @ x.T).relu().sum(0), [x_(0)])
    seen: list[int] = []
    hook = ir.gm.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out, wrong = verify.check_call(ir, lambda x: [(x @ x.T).relu().sum(0)], [x_(1)])
        assert wrong is None and seen == [1] and torch.get_num_threads() == 2
        torch.testing.assert_close(out[0], (x_(1) @ x_(1).T).relu().sum(0))
        with pytest.raises(RuntimeError), verify.one_torch_thread():
            raise RuntimeError("the reference failed")
        assert torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(threads)


_PLANTED_C = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
"""


def test_planted_tvm_library_is_rebuilt_never_loaded(tmp_path, monkeypatch):
    if not get_registry().availability("tvm").ok:
        pytest.skip("tvm backend unavailable")
    import subprocess

    from torchmux.core.registry import get_registry as reg
    from torchmux.extend import CompileRequest, authentic

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "cache"))
    ir = trace(f, [x_(0)])
    first = reg().get("tvm").compile(CompileRequest(ir, [x_(0)]))
    library = __import__("pathlib").Path(first.tvm_info.library)
    assert first.tvm_info.cache == "miss" and authentic(library)
    marker = tmp_path / "constructor-ran"
    (tmp_path / "planted.c").write_text(_PLANTED_C % marker)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "planted.c")], check=True)
    assert not authentic(library)
    again = reg().get("tvm").compile(CompileRequest(ir, [x_(0)]))
    assert again.tvm_info.cache == "miss" and not marker.exists()  # rebuilt; the planted code never ran
    assert library.with_name(library.name + ".untrusted").exists() and authentic(library)
    torch.testing.assert_close(again(x_(1))[0], f(x_(1)))
    assert reg().get("tvm").compile(CompileRequest(ir, [x_(0)])).tvm_info.cache == "hit"


def test_truncated_onnx_model_is_set_aside_and_rebuilt_once(tmp_path, monkeypatch):
    if not get_registry().availability("onnxruntime").ok:
        pytest.skip("onnxruntime backend unavailable")
    from torchmux.extend import CompileRequest

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    ir = trace(f, [x_(0)])
    get_registry().get("onnxruntime").compile(CompileRequest(ir, [x_(0)]))
    models = list(tmp_path.glob("onnxruntime/*/model*.onnx"))
    assert models
    for m in models:
        m.write_bytes(m.read_bytes()[:40])  # truncated
    again = get_registry().get("onnxruntime").compile(CompileRequest(ir, [x_(0)]))
    torch.testing.assert_close(again(x_(1))[0], f(x_(1)))
    # set aside before ONNX Runtime reads it: its digest (stored beside it) no longer matches
    assert all(m.with_name(m.name + ".untrusted").exists() for m in models)
    third = get_registry().get("onnxruntime").compile(CompileRequest(ir, [x_(0)]))  # repaired: a plain hit
    assert third.cache_hit and not list(tmp_path.glob("onnxruntime/*/*.untrusted.untrusted"))


def test_nonfinite_unsafe_ops_are_checked_on_every_nonfinite_call(tmp_path, monkeypatch):
    """A graph holding an op its backend declares unsafe on NaN is checked on every NaN call, not just the first."""
    from torchmux.autotune import verify

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # no schedule of an earlier test's f goes on here

    backend = get_registry().get("fault_none")
    inputs = [x_(i) for i in range(6)]
    for x in inputs[1:]:
        x[0, 0] = math.nan
    counted = []
    real = verify.check_call
    for i, unsafe in enumerate((frozenset(), frozenset({"aten.relu.default"}))):
        monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / str(i)))  # a schedule of its own
        torch._dynamo.reset()
        backend.nonfinite_unsafe = unsafe
        compiled = torchmux.compile(f, backend="fault_none", options={"verify": "sparse"})
        checks: list[int] = []

        def counting(*a, checks=checks, **k):  # counts, then runs the real check
            checks.append(1)
            return real(*a, **k)

        verify.check_call = counting
        try:
            assert_eager([compiled(x) for x in inputs], inputs)
        finally:
            verify.check_call, backend.nonfinite_unsafe = real, frozenset()
        counted.append(len(checks))
    # calls 1 2 3 4 5 6: declared safe -> 1, 2 (the first NaN); unsafe -> every NaN call 2..6 too
    assert counted == [2, 6], counted


def test_sparse_checks_the_schedule_and_each_new_kind_of_input(monkeypatch, tmp_path):
    """The sparse policy checks calls 1, 8, 16, 32, ... and the first call whose input is of a new kind: a new
    magnitude band, the first NaN, the first inf; a NaN again, off the schedule, is not checked. (The check
    budget, which may postpone a scheduled check on a graph this small, is lifted: the schedule alone.)"""
    from torchmux.autotune import verify

    monkeypatch.setattr(verify, "CHECK_BUDGET", math.inf)
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # no schedule of an earlier test's f goes on here

    inputs = [x_(i) for i in range(40)]
    inputs[20] = inputs[20] * 1e6  # call 21: a new magnitude band
    inputs[26][1, 2] = math.nan  # call 27: the first NaN
    inputs[32][0, 0] = math.inf  # call 33: the first inf
    inputs[34][3, 3] = math.nan  # call 35: a NaN again
    checked: list[int] = []
    now = [0]  # the call being made
    real = verify.check_call
    compiled = torchmux.compile(f, backend="fault_none", options={"verify": "sparse", "isolate": "off"})

    def counting(*a, **k):  # notes the call number, then runs the real check
        checked.append(now[0])
        return real(*a, **k)

    verify.check_call = counting
    try:
        for now[0], x in enumerate(inputs, 1):
            torch.testing.assert_close(compiled(x), f(x), equal_nan=True)
    finally:
        verify.check_call = real
    assert checked == [1, 8, 16, 21, 27, 32, 33], checked
    scheduled = [c for c in range(1, 50_000) if verify.scheduled(c)]
    assert all(verify.next_scheduled(c) == next(s for s in scheduled if s > c) for c in range(1, 40_000, 7))


def test_the_kind_of_an_input_sees_its_largest_magnitude_either_sign_and_nonfinite_values():
    """input_kind's one pass (min and max): the band of the largest magnitude whether it is the most
    negative or the most positive value, NaN anywhere (also beside an inf), -inf, half precision,
    a tensor that needs grad; integer and empty inputs are not scanned."""
    from torchmux.autotune.verify import input_kind

    small, big_negative = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.5, -3.0e6, 2.0])
    (band,), (band_negative,) = input_kind([small], [0]), input_kind([big_negative], [0])
    assert band == math.frexp(2.0)[1] // 4 and band_negative == math.frexp(3.0e6)[1] // 4
    assert input_kind([torch.tensor([1.0, math.inf, math.nan])], [0]) == ("nan",)
    assert input_kind([torch.tensor([-math.inf, 1.0])], [0]) == ("inf",)
    assert input_kind([torch.tensor([1.0, math.nan]).half()], [0]) == ("nan",)
    assert input_kind([torch.zeros(3, requires_grad=True)], [0]) == (-99,)
    assert input_kind([torch.arange(3), torch.empty(0), small], [0, 1, 2]) == (band,)


def test_a_large_input_is_scanned_on_one_torch_thread(monkeypatch):
    """A CPU input ATen would reduce on its OpenMP threads is scanned on one (no workers left spinning
    beside a backend's own thread pool); a small one, below ATen's grain, as it is; the same kind either
    way, and the program's thread count is given back."""
    from torchmux.autotune import verify

    seen: list[int] = []

    def scan(t):  # the real reduction, observed
        seen.append(torch.get_num_threads())
        return torch.aminmax(t)

    monkeypatch.setattr(verify, "_RANGE", scan)
    large, small = torch.full((verify._GRAIN + 1,), 3.0), torch.full((8,), 3.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert verify.input_kind([large, small], [0, 1]) == (math.frexp(3.0)[1] // 4,) * 2
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_conformance_cases_have_nonfinite_variants():
    from torchmux.testing.cases import CASES

    case = next(c for c in CASES if c.op == "aten.relu.default")
    x = case.nonfinite_inputs(torch.float32)[0]
    assert bool(torch.isnan(x).any()) and bool(torch.isinf(x).any())
    from torchmux.testing.check import check_nonfinite

    assert check_nonfinite(get_registry().get("eager"), case, torch.float32) is None


@pytest.mark.parametrize("content", [None, "{not json", '"a string"', '{"models": 3}'])
def test_bench_from_json_with_a_bad_file_says_so(tmp_path, capsys, content):
    from torchmux.bench.cli import main

    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    assert main(["--from-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--from-json" in err and "Traceback" not in err


def test_naming_a_builtin_plugin_again_keeps_it():
    import subprocess

    env = dict(os.environ, TORCHMUX_PLUGINS="torchmux.backends.eager")
    out = subprocess.run(
        [sys.executable, "-c", "import torchmux.core.registry as m; print('eager' in m.get_registry().names)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.stdout.strip() == "True", out.stderr[-2000:]


class _HangsInCompileHere(faulty_backends._Fault):
    name = "fault_hang_compile_here"  # defined here, registered as an object: no child can rebuild it

    def compile(self, request):
        threading.Event().wait()  # forever


class _HangsInCallHere(faulty_backends._Fault):
    name = "fault_hang_call_here"

    def fault(self, out, args, call):
        threading.Event().wait()


class _RunTimePlugin:
    @staticmethod
    @torchmux.hookimpl
    def torchmux_add_backends():
        return [_HangsInCompileHere(), _HangsInCallHere()]


_RUN_TIME_PLUGIN = _RunTimePlugin()


@pytest.mark.parametrize(
    "backend",
    [
        "fault_hang_compile_here",
        "fault_hang_call_here",
        ["fault_hang_compile_here", "eager"],  # auto: an object registered at run time is not isolated
    ],
)
def test_a_hang_outside_a_child_costs_the_deadline_not_the_program(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHMUX_VERBOSE", "1")  # auto names its failed candidates only when verbose
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # measured now, not a decision remembered
    if "fault_hang_call_here" not in get_registry().names:
        torchmux.register_plugin(_RUN_TIME_PLUGIN, "run_time_plugin")
    t0 = time.monotonic()
    outs, warned = run_calls(backend, [x_(0), x_(1)], trial_deadline=2)
    assert time.monotonic() - t0 < 30  # two seconds of deadline, plus eager's compile on a loaded machine
    assert_eager(outs, [x_(0), x_(1)])
    name = backend if isinstance(backend, str) else backend[0]
    assert len(warned) == 1 and f"{name} timed out after 2 s" in str(warned[0].message)
    stuck = [t for t in threading.enumerate() if t.name == "torchmux-trial"]
    assert stuck and all(t.daemon for t in stuck)  # abandoned, never joined: exiting is not blocked


def test_a_hang_on_a_symbolic_graph_costs_the_deadline_once():
    if "fault_hang_call_here" not in get_registry().names:
        torchmux.register_plugin(_RUN_TIME_PLUGIN, "run_time_plugin")
    compiled = torchmux.compile(f, backend="fault_hang_compile_here", dynamic=True, options={"trial_deadline": 2})
    inputs = [torch.randn(n, 8, generator=torch.Generator().manual_seed(n)) for n in (3, 5, 300)]
    stuck_before = sum(t.name == "torchmux-trial" for t in threading.enumerate())
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled(x) for x in inputs]
    assert time.monotonic() - t0 < 30
    assert_eager(outs, inputs)
    warned = [str(w.message) for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
    assert warned and all("timed out after 2 s" in w for w in warned)
    assert sum(t.name == "torchmux-trial" for t in threading.enumerate()) == stuck_before + 1  # never tried again


# ------------------------------------------------------------------------------- isolation of every backend
def test_a_named_backend_that_segfaults_is_isolated_too(tmp_path, monkeypatch):
    """Not only auto's candidates: ``backend="<name>"`` is tried in the child first as well."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # no verdict on f from an earlier test stands in
    outs, warned = run_calls("fault_segfault", [x_(0), x_(1)], isolate="all")
    assert_eager(outs, [x_(0), x_(1)])
    assert len(warned) == 1 and "crashed with signal 11" in str(warned[0].message)
    assert warned[0].filename == __file__


def test_the_trial_child_lives_on_and_is_replaced_after_a_crash(tmp_path, monkeypatch):
    """One child runs trial after trial (torch is imported once); a trial that kills it costs one new start.
    A cache of its own: a verdict is remembered per graph structure and backend, and earlier tests left some."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    run_calls(["fault_wrong_nan"], [torch.randn(6, 7)], isolate="all")  # the child is up after it
    starts, trials = isolate._SERVER.starts, isolate._SERVER.trials
    torch._dynamo.reset()
    run_calls(["fault_mutates_input"], [torch.randn(6, 9)], isolate="all")
    assert (isolate._SERVER.starts, isolate._SERVER.trials) == (starts, trials + 1)  # the same child
    torch._dynamo.reset()
    run_calls(["fault_abort"], [torch.randn(6, 11)], isolate="all")  # kills it
    torch._dynamo.reset()
    x = torch.randn(6, 13)
    outs, _ = run_calls(["fault_reuses_buffer"], [x], isolate="all")
    assert (isolate._SERVER.starts, isolate._SERVER.trials) == (starts + 1, trials + 3)
    assert_eager(outs, [x])


def test_the_trial_builds_as_the_parent_will():
    """The child builds under the parent's grad mode and thread count: a backend honest under ``no_grad``
    (as the runner builds) passes its trial and runs here."""
    x = torch.randn(6, 15)
    outs, _ = run_calls(["fault_abort_under_grad"], [x], isolate="all")
    assert_eager(outs, [x])
    assert faulty_backends.AbortsUnderGrad.compiled_here >= 1  # chosen after its trial: it runs in this process


def _fresh():
    """A graph no earlier test compiled (its constant is new), so every cache starts cold for it."""
    k = 1.0 + (time.time_ns() % 1_000_000) / 1e7

    def g(x):
        return torch.tanh(x) * k + x

    return g, k


def test_a_builtin_trial_is_built_once_in_the_child_and_loaded_by_the_parent(monkeypatch):
    """isolate="all": ONNX Runtime's export runs in the child; the parent loads the child's model from the
    cache (no second export)."""
    from torchmux.backends.onnxruntime import session

    exports = []  # the real export, counted
    real = session.export_onnx
    monkeypatch.setattr(session, "export_onnx", lambda *a, **kw: exports.append(1) or real(*a, **kw))
    g, _ = _fresh()
    trials = isolate._SERVER.trials
    compiled = torchmux.compile(g, backend="onnxruntime", options={"isolate": "all"})
    x = x_(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchmuxFallbackWarning)  # it runs on ONNX Runtime: no fallback
        torch.testing.assert_close(compiled(x), g(x))
    assert isolate._SERVER.trials == trials + 1
    assert exports == []  # the parent exported nothing: the child's model came through the cache
    folders = list((torchmux.core.settings.CACHE_DIR.get() / "onnxruntime").glob("*/model.opt.onnx"))
    assert folders


def test_inductor_trial_in_the_child_is_a_cache_hit_in_the_parent():
    from torch._dynamo.utils import counters

    g, _ = _fresh()
    counters.clear()
    compiled = torchmux.compile(g, backend="inductor", options={"isolate": "all"})
    x = x_(0)
    torch.testing.assert_close(compiled(x), g(x))
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1, dict(counters["inductor"])
    assert counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])


def test_an_idle_child_leaves_and_the_next_trial_starts_a_new_one(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHMUX_TRIAL_CHILD_IDLE", "1")
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "first"))  # a verdict of an earlier test is no trial
    monkeypatch.setattr(isolate, "_SERVER", isolate.TrialChild())  # a child started under this setting
    x = torch.randn(7, 3)
    run_calls(["fault_none"], [x], isolate="all")
    child = isolate._SERVER._proc
    assert child is not None and child.wait(timeout=60) == 0  # it left by itself, idle
    torch._dynamo.reset()
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "second"))  # f at another size: a trial again
    y = torch.randn(7, 5)
    outs, warned = run_calls(["fault_none"], [y], isolate="all")
    assert_eager(outs, [y])
    assert (isolate._SERVER.starts, isolate._SERVER.trials) == (2, 2) and not warned
    isolate._SERVER.stop()


def test_a_child_that_cannot_start_leaves_plugins_out_with_one_warning(monkeypatch, tmp_path):
    """No trial child can run (a Python that cannot run torchmux): a plugin's backend, untried, is not run
    in the user's process (an aborting one would kill it); one warning says why."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # no verdict of an earlier test stands for a trial
    monkeypatch.setattr(isolate, "_SERVER", isolate.TrialChild())
    monkeypatch.setattr(isolate.sys, "executable", "/bin/false")
    inputs = [torch.randn(7, 9), torch.randn(7, 11)]
    outs, warned, starts = [], [], []
    for x, name in zip(inputs, ["fault_abort", "fault_none"]):
        torch._dynamo.reset()
        o, w = run_calls([name, "eager"], [x], isolate="all")
        outs += o
        warned += w
        starts.append(isolate._SERVER.starts)
    assert_eager(outs, inputs)
    unavailable = [w for w in warned if "isolated trials are unavailable" in str(w.message)]
    assert len(unavailable) == 1 and unavailable[0].filename == __file__
    # the one compile() started (none where f was compiled with these backends before: a warm start)
    # and the one the first trial asked; after that, none
    assert starts[0] in (1, 2) and starts[1] == starts[0], starts


# ------------------------------------------------------------------------- a second input shape (issue 29)
class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


#: the fault table of issue 29: each backend fault and what its one warning names
FAULT_ROWS = [
    ("fault_abort", "crashed with signal 6"),
    ("fault_segfault", "crashed with signal 11"),
    ("fault_wrong_late", "wrong answer"),
    ("fault_wrong_2nd", "wrong answer"),
    ("fault_reuses_buffer", "reused output buffers"),
    ("fault_mutates_input", "changed its input"),
    ("fault_aliases_input", "changed its input"),  # it writes its answer into the input's memory
    ("fault_hang_compile", "timed out after 3 s"),
    ("fault_hang_call", "timed out after 3 s"),
    ("fault_raises_5th", "raised RuntimeError"),  # not in the table: a later call that raises
]


def two_shapes(backend, *, grad=False, dynamic=None, batches=(4,) * 8 + (6,) * 2 + (4,), deadline=3.0, **options):
    """The issue's program: an MLP called 8 times at batch 4, twice at batch 6, once more at batch 4 (with
    ``grad``: forward and ``backward()`` each call). Checks what the user got against eager after every
    call (inputs untouched, gradients) and after the last (no output overwritten by a later call); returns
    the fallback warnings and the seconds the calls took."""
    torch.manual_seed(0)
    model = _MLP()
    reference = _MLP()
    reference.load_state_dict(model.state_dict())
    compiled = torchmux.compile(
        model, backend=backend, dynamic=dynamic, options={"trial_deadline": deadline, **options}
    )
    inputs = [torch.randn(n, 8, generator=torch.Generator().manual_seed(i)) for i, n in enumerate(batches)]
    outs, expected = [], []
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in inputs:
            kept = x.clone()
            with torch.set_grad_enabled(grad):
                out = compiled(x)
                want = reference(kept)
            torch.testing.assert_close(x, kept, rtol=0, atol=0)  # the user's input is the user's
            torch.testing.assert_close(out, want)
            if grad:
                out.sum().backward()
                want.sum().backward()
                for p, q in zip(model.parameters(), reference.parameters()):
                    torch.testing.assert_close(p.grad, q.grad)
                model.zero_grad()
                reference.zero_grad()
            outs.append(out)
            expected.append(want.detach())
    seconds = time.monotonic() - t0
    for out, want in zip(outs, expected):  # no later call overwrote an output it returned earlier
        torch.testing.assert_close(out.detach(), want)
    return [w for w in caught if issubclass(w.category, TorchmuxFallbackWarning)], seconds


@pytest.mark.parametrize("name, reason", FAULT_ROWS, ids=[r[0] for r in FAULT_ROWS])
@pytest.mark.parametrize("mode", ["named", "list"])
def test_a_second_shape_gets_the_first_shapes_protection(name, reason, mode, tmp_path, monkeypatch):
    """Every row of the fault table, on the two-shape program: eager's answer on every call (the user's
    inputs untouched, no output overwritten), and one warning naming the fault (named; auto, which warns
    only when verbose, at most that one). A hang costs the deadline once, not once per graph."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # nothing remembered from another test
    trials = isolate._SERVER.trials
    warned, seconds = two_shapes(name if mode == "named" else [name, "eager"])
    messages = [str(w.message) for w in warned]
    if mode == "named":
        assert len(warned) == 1 and name in messages[0] and reason in messages[0], messages
        assert warned[0].filename == __file__
    else:
        assert len(warned) <= 1 and all(name in m and reason in m for m in messages), messages
    # one isolated trial for the three graphs (batch 4, the symbolic recapture at 6, and at 4 again): a hang
    # costs one deadline (3 s) and at most a child's start, not one deadline per graph
    assert isolate._SERVER.trials - trials == 1
    if "hang" in name:
        assert seconds < 3.0 + isolate.STARTUP_SECONDS, seconds


@pytest.mark.parametrize("name, reason", FAULT_ROWS, ids=[r[0] for r in FAULT_ROWS])
def test_a_symbolic_graph_from_the_first_call_is_tried_checked_and_guarded(name, reason, tmp_path, monkeypatch):
    """``dynamic=True``: the first graph is symbolic, so no static graph's verdict can stand for it. Its
    backend is tried in a child on the graph at the call's sizes, checked on copies of the inputs, and
    guarded: the same answer, the same one warning."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    warned, _ = two_shapes(name, dynamic=True)
    messages = [str(w.message) for w in warned]
    assert len(warned) == 1 and name in messages[0] and reason in messages[0], messages


def test_a_symbolic_graphs_trial_runs_in_a_child_on_its_static_specialization(tmp_path, monkeypatch):
    """``dynamic=True``: the first graph is symbolic (no pickle of it reaches a child). Its backend's
    isolated trial runs in the child on the graph specialized to the call's sizes (static, 5x8 here);
    then, tried, the backend builds the symbolic graph in this process, once, for every size."""
    record = tmp_path / "graphs.jsonl"
    monkeypatch.setenv("FAULTY_BACKENDS_RECORD", str(record))  # the child started below inherits it
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(isolate, "_SERVER", isolate.TrialChild())
    try:
        compiled = torchmux.compile(f, backend="fault_records_graphs", dynamic=True, options={"isolate": "all"})
        inputs = [torch.randn(5, 8), torch.randn(7, 8)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", TorchmuxFallbackWarning)  # tried and safe: no fallback
            assert_eager([compiled(x) for x in inputs], inputs)
        assert isolate._SERVER.trials == 1
    finally:
        isolate._SERVER.stop()
    built = [json.loads(line) for line in record.read_text().splitlines()]
    child = [b for b in built if b["pid"] != os.getpid()]
    here = [b for b in built if b["pid"] == os.getpid()]
    assert child and all(b["static"] and b["shapes"] == [["5", "8"]] for b in child), built
    assert len(here) == 1 and not here[0]["static"], built  # the symbolic graph, built once in this process


GRAD_ROWS = FAULT_ROWS


@pytest.mark.parametrize("name, reason", GRAD_ROWS, ids=[r[0] for r in GRAD_ROWS])
@pytest.mark.parametrize("mode", ["named", "list"])
def test_a_second_shape_with_gradients(name, reason, mode, tmp_path, monkeypatch):
    """With gradients on, forward and backward at each shape: eager's outputs and gradients; at most one
    warning per graph (the forward graph and the backward graph are two graphs of the backend's). A
    training forward graph also returns its input (saved for backward): a backend writing into the
    input is then caught by the answer's check, as a wrong answer."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    warned, _ = two_shapes(name if mode == "named" else [name, "eager"], grad=True)
    messages = [str(w.message) for w in warned]
    assert len(warned) <= 2 and all(name in m and (reason in m or "wrong answer" in m) for m in messages), messages
    assert warned or mode == "list"


#: rows a candidate's trial catches (its compile and first two checked calls): auto, verbose, names them;
#: the others turn wrong or raise only later (the trial compares its first answer's values), and matter
#: under auto only where auto chose that backend: its check of the user's call 1 catches them
CAUGHT_IN_TRIAL = {r[0] for r in FAULT_ROWS} - {
    "fault_wrong_late",
    "fault_raises_5th",
}  # the trial compares both its calls
#: under auto a backend raising on its 5th call raises while it is timed (the reason says so)
AUTO_REASONS = {"fault_raises_5th": "kernel launch failed"}


@pytest.fixture(scope="module")
def competitors_cache(tmp_path_factory):
    """One cache for the plain-auto rows: the built-in backends' builds (ONNX models, Inductor's FX graphs)
    and their trials' verdicts on the MLP's graphs are made once, by the first row that needs them, and
    are cache hits for the rest; each row's fault backend is another candidate set, so measured anew.
    Made here with the default deadline (a cold Inductor build on a busy machine may take more than the
    rows' 3 s), with and without gradients."""
    folder = tmp_path_factory.mktemp("auto-competitors")
    old = os.environ.get("TORCHMUX_CACHE_DIR")
    os.environ["TORCHMUX_CACHE_DIR"] = str(folder)
    try:
        for grad in (False, True):
            torch._dynamo.reset()
            two_shapes("auto", grad=grad, deadline=30.0)
    finally:
        if old is None:
            del os.environ["TORCHMUX_CACHE_DIR"]
        else:
            os.environ["TORCHMUX_CACHE_DIR"] = old
    return folder


@pytest.fixture
def competing():
    """Make a fault backend one of plain ``backend="auto"``'s candidates for one test, as a third-party
    plugin that does not opt out of auto is; it is taken out of auto again afterwards."""
    made: list = []

    def add(name):
        backend = get_registry().get(name)
        backend.auto = True  # the instance's: the class keeps auto = False for every other test
        made.append(backend)

    yield add
    for backend in made:
        del backend.auto


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name, reason", FAULT_ROWS, ids=[r[0] for r in FAULT_ROWS])
def test_a_second_shape_under_plain_auto(name, reason, grad, competitors_cache, competing, monkeypatch):
    """``backend="auto"`` with the faulty backend installed beside the built-ins (eager, Inductor, ONNX
    Runtime, Triton's interpreter here): the two-shape program gets eager's answers (and gradients) on
    every call, its inputs untouched, no output overwritten, the process alive; a fault the trial catches
    is named once per graph (auto names failed candidates when verbose) with its reason; a hang costs
    the user one trial deadline (3 s) and at most a child's start beside the other candidates' builds."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(competitors_cache))
    monkeypatch.setenv("TORCHMUX_VERBOSE", "1")
    competing(name)
    chosen: list[str] = []

    class Spy:
        @staticmethod
        @torchmux.hookimpl
        def torchmux_candidate_measured(ir, backend, seconds, ok, reason, chosen, eager_ops):
            if chosen:
                picked.append(backend)

    picked = chosen
    torchmux.register_plugin(Spy(), f"spy_{name}_{grad}")
    try:
        warned, seconds = two_shapes("auto", grad=grad, autotune_budget=0.05)  # timing is not what is tested
    finally:
        get_registry().pm.unregister(name=f"spy_{name}_{grad}")
    # what names it as a failed candidate ("fault_x crashed with ..."), not a list of the candidates
    about = [str(w.message) for w in warned if f"{name} " in str(w.message)]
    assert len(about) <= (2 if grad else 1), about
    reason = AUTO_REASONS.get(name, reason)
    assert all(reason in m or "wrong answer" in m for m in about), about
    if name in CAUGHT_IN_TRIAL:
        assert about, [str(w.message) for w in warned]
        assert name not in chosen, chosen
    elif name in chosen:  # it ran the user's calls: its later fault was caught and demoted it
        assert about, [str(w.message) for w in warned]
    if "hang" in name:
        assert seconds < 3.0 + isolate.STARTUP_SECONDS, seconds


def test_the_default_deadline_is_well_under_a_minute_and_holds(monkeypatch, tmp_path):
    """No deadline given: a backend that hangs in its compile (in-process: an object a child cannot rebuild)
    costs the first call the documented default, 30 s, not five minutes; max-autotune, where backends
    tune, waits 300 s; TORCHMUX_TRIAL_DEADLINE, set, holds in every mode."""
    from torchmux.core import settings
    from torchmux.core.config import resolve

    monkeypatch.delenv("TORCHMUX_TRIAL_DEADLINE", raising=False)
    assert settings.TRIAL_DEADLINE_SECONDS == 30.0 and resolve("eager", None, None).trial_deadline == 30.0
    assert resolve("eager", "max-autotune", None).trial_deadline == settings.TUNING_TRIAL_DEADLINE_SECONDS
    monkeypatch.setenv("TORCHMUX_TRIAL_DEADLINE", "7")
    assert resolve("eager", "max-autotune", None).trial_deadline == 7.0
    monkeypatch.delenv("TORCHMUX_TRIAL_DEADLINE")
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    if "fault_hang_call_here" not in get_registry().names:
        torchmux.register_plugin(_RUN_TIME_PLUGIN, "run_time_plugin")
    compiled = torchmux.compile(f, backend="fault_hang_compile_here")
    t0 = time.monotonic()
    with pytest.warns(TorchmuxFallbackWarning, match="timed out after 30 s"):
        assert_eager([compiled(x_(0))], [x_(0)])
    waited = time.monotonic() - t0
    assert 30 <= waited < 60, waited  # the deadline, plus eager's compile on a loaded machine


# ------------------------------------------------------------------------------ cache files are untrusted data
def test_an_undecodable_decision_file_is_a_miss_with_a_warning(tmp_path, monkeypatch):
    """A decision file replaced by random bytes (not UTF-8): the next compile measures again, with one
    warning, instead of raising UnicodeDecodeError out of the user's call."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    compiled = torchmux.compile(f, backend=["eager", "fault_none"], options={"isolate": "off"})
    compiled(x_(0))
    files = list((tmp_path / "decisions").glob("*.json"))
    assert files
    for p in files:
        p.write_bytes(bytes(range(128, 256)) * 4)  # no valid UTF-8 in it
    torch._dynamo.reset()
    compiled = torchmux.compile(f, backend=["eager", "fault_none"], options={"isolate": "off"})
    with pytest.warns(TorchmuxFallbackWarning, match="not valid.*UnicodeDecodeError"):
        assert_eager([compiled(x_(0))], [x_(0)])
    assert all(p.with_name(p.name + ".bad").exists() for p in files)


def test_a_swapped_onnx_model_is_never_run(tmp_path, monkeypatch):
    """A cached ONNX model replaced by another valid model of the same signature is checked against the
    digest stored beside it before it runs (``verify`` has no say in it): set aside, rebuilt, right answer."""
    if not get_registry().availability("onnxruntime").ok:
        pytest.skip("onnxruntime backend unavailable")
    import gc

    import onnxruntime as ort

    from torchmux.extend import CompileRequest

    def other(x):
        return torch.relu(x) * 3 - 1  # the same signature, another answer

    backend = get_registry().get("onnxruntime")
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "other"))
    backend.compile(CompileRequest(trace(other, [x_(0)]), [x_(0)]))
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "mine"))
    ir = trace(f, [x_(0)])
    first = backend.compile(CompileRequest(ir, [x_(0)]))
    del first
    gc.collect()  # no live session of the file: the next compile opens it again
    (folder,) = (tmp_path / "mine" / "onnxruntime").iterdir()
    (theirs,) = (tmp_path / "other" / "onnxruntime").iterdir()
    for name in ("model.onnx", "model.opt.onnx"):
        (folder / name).write_bytes((theirs / name).read_bytes())  # valid, same signature, wrong answer
    swapped = ort.InferenceSession(str(folder / "model.opt.onnx"))
    (wrong,) = swapped.run(None, {swapped.get_inputs()[0].name: x_(1).numpy()})
    assert not torch.allclose(torch.from_numpy(wrong), f(x_(1)))  # what running it would have answered
    del swapped
    again = backend.compile(CompileRequest(ir, [x_(0)]))
    torch.testing.assert_close(again(x_(1))[0], f(x_(1)))
    assert not again.cache_hit
    assert (folder / "model.opt.onnx.untrusted").exists() and (folder / "model.onnx.untrusted").exists()
    assert backend.compile(CompileRequest(ir, [x_(0)])).cache_hit  # rebuilt and signed: a plain hit again


# ------------------------------------------------------------------------------------ what checking costs
def test_the_check_budget_postpones_a_scheduled_check_and_never_drops_it(tmp_path, monkeypatch):
    """A graph so small that a check costs many of its calls: calls 1 and 8 are checked, then the
    scheduled checks (16, 32, ...) wait until the checks fit in CHECK_BUDGET of the calls' time; a backend
    wrong from its 20th call (the user's 18th) is still caught, later than call 16, and every answer
    after that is eager's."""
    from torchmux.autotune import verify

    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))  # a schedule of its own
    assert verify.within_budget(10, 1.0, 0.1, 0.1) == 100 and verify.within_budget(200, 1.0, 0.1, 0.1) == 200
    assert verify.within_budget(3, 5.0, 0.0, 0.1) == 3  # no call timed yet: nothing to weigh against
    checked: list[int] = []
    now = [0]
    real = verify.check_call
    compiled = torchmux.compile(f, backend="fault_wrong_20th", options={"isolate": "off"})

    def counting(*a, **k):  # notes the call number, then runs the real check
        checked.append(now[0])
        return real(*a, **k)

    verify.check_call = counting
    outs, inputs = [], []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            while len(checked) < 3 and now[0] < 100_000:  # the third check catches it, wherever it falls
                now[0] += 1
                inputs.append(x_(now[0] % 64))
                outs.append(compiled(inputs[-1]))
    finally:
        verify.check_call = real
    warned = [str(w.message) for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
    assert len(warned) == 1 and "wrong answer" in warned[0], warned
    assert checked[:2] == [1, 8], checked
    caught_at = checked[2]  # the first check after call 8: the one that finds the wrong answers
    assert caught_at > 16, checked  # postponed past the schedule's 16 (a check costs many calls of f)
    assert all(not torch.allclose(o, f(x)) for o, x in zip(outs[17 : caught_at - 1], inputs[17 : caught_at - 1]))
    assert torch.allclose(outs[caught_at - 1], f(inputs[caught_at - 1]))  # the call that caught it: eager's answer
    for x in [x_(i) for i in range(5)]:
        torch.testing.assert_close(compiled(x), f(x))  # and every call after it


def test_the_schedule_goes_on_after_a_recompile(tmp_path, monkeypatch):
    """``torch._dynamo.reset()`` and a recompile of the same graph: the new build's first call is checked
    (a new build's first answer), and the schedule goes on from the calls the graph already had in this
    process (its next check at call 32), instead of checking calls 1 and 8 of the new build again."""
    from torchmux.autotune import verify

    monkeypatch.setattr(verify, "CHECK_BUDGET", math.inf)  # the schedule alone
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    checked: list[int] = []
    now = [0]
    real = verify.check_call

    def counting(*a, **k):  # notes the call number, then runs the real check
        checked.append(now[0])
        return real(*a, **k)

    monkeypatch.setattr(verify, "check_call", counting)
    for _build in range(2):
        torch._dynamo.reset()
        compiled = torchmux.compile(f, backend="fault_none", options={"isolate": "off"})
        for _ in range(20):
            now[0] += 1
            x = x_(now[0])
            torch.testing.assert_close(compiled(x), f(x))
    assert checked == [1, 8, 16, 21, 32], checked  # the second build: its first call (21), then the schedule's 32


def test_a_check_costs_about_an_eager_call():
    """The comparison is a few passes in the outputs' precision, not the float64 rule with masks that cost
    six eager calls: on a 256x1024 output it takes fewer passes over the data than the eager graph (ten
    pointwise ops), counted with the profiler, not timed."""
    from torch.profiler import ProfilerActivity, profile

    from torchmux.core.compare import mismatch

    x = torch.randn(1, 256, 1024)
    ref, out = [x.tanh()], [x.tanh()]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        assert mismatch(out, ref) is None
    full = [  # the kernels that pass over the whole output (not views, scalars or allocations)
        e.name
        for e in prof.events()
        if e.name.startswith("aten::") and e.input_shapes and e.input_shapes[0] == [1, 256, 1024]
        if e.name not in ("aten::detach", "aten::to", "aten::empty", "aten::empty_like")
    ]
    assert "aten::_to_copy" not in full and "aten::index" not in full, full  # no float64 copy, no masks
    assert len(full) <= 12, full  # eight passes (an op's nested dispatch, abs -> abs.out, is listed twice)
    assert "outside tolerance" in (mismatch([ref[0] + 1], ref) or "")  # and it still says where and by how much


def test_small_outputs_are_judged_alike_in_numpy():
    """Outputs of up to 65,536 elements are compared in NumPy (a torch op's dispatch cost more than the
    MLP call it checked): the same verdicts as the full rule, on a value within tolerance, one outside
    it, a NaN or an infinity on either side, half precision, and a non-contiguous view."""
    from torchmux.core.compare import _close, mismatch

    g = torch.Generator().manual_seed(0)
    r = torch.randn(4, 64, generator=g)
    assert mismatch([r * (1 + 1e-6)], [r]) is None and _close(r * (1 + 1e-6), r, 1e-4, 1e-4)
    for bad, why in (
        (r.clone().index_fill_(1, torch.tensor([5]), 9.0), "outside tolerance"),
        (r.clone().index_fill_(1, torch.tensor([5]), float("nan")), "NaN in"),
        (r.clone().index_fill_(1, torch.tensor([5]), float("inf")), "outside tolerance"),
    ):
        assert not _close(bad, r, 1e-4, 1e-4)
        assert why in (mismatch([bad], [r]) or ""), mismatch([bad], [r])
    with_inf = r.clone().index_fill_(1, torch.tensor([7]), float("inf"))
    assert mismatch([with_inf.clone()], [with_inf]) is None  # the same infinity: the full rule accepts it
    assert mismatch([r.half()], [r.half()]) is None and mismatch([r.t()], [r.t().contiguous()]) is None
    r.untyped_storage().resize_(0)  # the compared tensors' storage stays resizable (FSDP frees weights so)


def _calls_until_demoted(backend: str, calls: int) -> tuple[list[int], list[int], list[str]]:
    """Compile f on ``backend`` (no check budget: the schedule alone) and call it ``calls`` times, each
    call on a fresh input, letting every check beside a call reach its verdict before the next call (so
    the call that acts on it is known). Returns the calls whose answer was not eager's, the calls that
    changed the user's input, and the fallback warnings."""
    from torchmux.autotune import verify

    compiled = torchmux.compile(f, backend=backend, options={"isolate": "off"})
    wrong, changed = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(1, calls + 1):
            x = x_(call)
            kept = x.clone()
            if not torch.allclose(compiled(x), f(kept)):
                wrong.append(call)
            if not torch.equal(x, kept):
                changed.append(call)
            assert verify.settle_checks()
    return wrong, changed, [str(w.message) for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a check beside the call needs a second CPU")
@pytest.mark.parametrize("threads", [1, 2])
def test_at_one_torch_thread_a_scheduled_check_runs_beside_the_call(threads, tmp_path, monkeypatch):
    """At one torch thread (and a second CPU) the schedule's check at call 32 runs beside the call: call 32
    returns the backend's answer, the worker's verdict demotes it, and call 33 on is eager's, with one
    warning that names call 32. At two threads the same check answers call 32 itself (the reference's
    answer). A backend wrong from its 20th call is the user's call 18 (the trial made two calls)."""
    from torchmux.autotune import verify

    monkeypatch.setattr(verify, "CHECK_BUDGET", math.inf)  # the schedule alone
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        wrong, changed, warned = _calls_until_demoted("fault_wrong_20th", 40)
    finally:
        torch.set_num_threads(before)
    assert wrong == list(range(18, 33 if threads == 1 else 32)), wrong
    assert changed == [] and len(warned) == 1 and "on call 32" in warned[0], warned
    assert ("checked beside the call" in warned[0]) == (threads == 1), warned[0]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a check beside the call needs a second CPU")
def test_a_check_beside_the_call_still_judges_input_writes_before_returning(tmp_path, monkeypatch):
    """What the user could see changed is judged in the call itself, beside it or not: a backend that
    writes into its input from its 20th call (the user's 18th) changes the user's tensors on the unchecked
    calls 18-31, as any trusted backend could; at call 32 its check runs it on copies, finds the write,
    answers with the reference and demotes it, all before returning."""
    from torchmux.autotune import verify

    monkeypatch.setattr(verify, "CHECK_BUDGET", math.inf)
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        wrong, changed, warned = _calls_until_demoted("fault_mutates_20th", 36)
    finally:
        torch.set_num_threads(before)
    assert changed == list(range(18, 32)) and wrong == [], (changed, wrong)
    assert len(warned) == 1 and "changed its input 0" in warned[0] and "on call 32" in warned[0], warned


def test_a_check_beside_the_call_returns_the_backends_answer_and_judges_it_on_the_worker():
    """check_beside returns what the backend answered at once; the reference runs later on the checks'
    worker thread (one torch thread, gradients off) and the verdict names the wrong answer, with the
    check's whole cost in seconds."""
    import threading

    from torchmux.autotune import verify

    ir = trace(lambda x: (x @ x.T).relu().sum(0), [x_(0)])
    seen: list[tuple[str, int, bool]] = []
    hook = ir.gm.register_forward_pre_hook(
        lambda module, args: seen.append(
            (threading.current_thread().name, torch.get_num_threads(), torch.is_grad_enabled())
        )
    )
    verdicts: list[tuple[str | None, float]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the guard submits: only while torch runs on one thread
    try:
        out, fault = verify.check_beside(
            ir, lambda x: [(x @ x.T).relu().sum(0) + 1], [x_(1)], lambda r, s: verdicts.append((r, s))
        )
        assert fault is None and verify.settle_checks()
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    torch.testing.assert_close(out[0], (x_(1) @ x_(1).T).relu().sum(0) + 1)  # the backend's own answer
    assert seen == [("torchmux-checks", 1, False)], seen
    assert len(verdicts) == 1 and (verdicts[0][0] or "").startswith("wrong answer") and verdicts[0][1] > 0, verdicts


# ------------------------------------------------------------------------------- torchmux.export's trials
@pytest.mark.parametrize(
    "name, reason, site",
    [
        ("fault_segfault", "crashed with signal 11", "faulty_backends.py:{} fault"),
        ("fault_segfault_on_load", "crashed with signal 11", "faulty_backends.py:{} load"),  # as its package loads
        ("fault_abort", "crashed with signal 6", "faulty_backends.py:{} fault"),
        ("fault_hang_compile", "timed out after 3 s", None),
    ],
)
def test_an_export_tries_each_backend_in_the_child_first(name, reason, site, tmp_path, monkeypatch):
    """``torchmux.export`` screens its candidates as ``compile()`` does: each is built, called, saved and
    loaded back in the trial child first. A backend that kills or stalls that child is a failed row of the
    plan, with its reason, and for a crash the place in the backend's code where it died (the child's
    ``faulthandler`` stacks); the package runs eager's program, with one warning at the user's line, and
    answers as eager does after a load. The verdict is kept: a second export of the program asks no child."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    before = isolate._SERVER.trials
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = torchmux.export(model, (x,), backend=name, options={"trial_deadline": 3.0})
    warned = [w for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
    assert exported.backend == "eager" and isolate._SERVER.trials == before + 1
    assert len(warned) == 1 and reason in str(warned[0].message) and name in str(warned[0].message)
    assert warned[0].filename == __file__
    row = next(c for c in exported.plan["candidates"] if c["backend"] == name)
    assert not row["ok"] and reason in row["reason"] and row["artifact"] is None
    if site is not None:
        backend = type(get_registry().get(name))
        source, first = inspect.getsourcelines(backend.load if "load" in site else backend.fault)
        number = first + next(i for i, text in enumerate(source) if "string_at(0)" in text or "abort()" in text)
        assert site.format(number) in row["reason"], row["reason"]  # the line that killed the child
    loaded = torchmux.load(exported.save(tmp_path / "m.tmux"))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    torchmux.export(model, (x,), backend=name, options={"trial_deadline": 3.0})
    assert isolate._SERVER.trials == before + 1  # remembered on disk
