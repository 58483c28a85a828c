"""The backend contract (core/backend.py) as the rest of torchmux enforces it: contract version,
phases, granularity, options schema, cost estimates, kernel_count, and what explain says."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import torchmux
import torchmux.extend
from torchmux.core.registry import Registry, get_registry


class _Recording(torchmux.Backend):
    """Runs what it is given eagerly and records every graph it compiled (op names per compile)."""

    devices = ("cpu",)
    auto = False  # only the tests that name it use it

    def __init__(self, name: str, **attrs):
        self.name, self.compiled = name, []
        for key, value in attrs.items():
            setattr(self, key, value)

    def compile(self, request):
        self.compiled.append(sorted(str(n.target) for n in request.ir.op_nodes))
        forward = request.ir.gm.forward

        def run(*args):
            return list(forward(*args))

        run.kernel_count = len(request.ir.op_nodes)
        return run


@pytest.fixture
def use():
    """Register backends for one test and take them out of the process-wide registry afterwards, so
    that no other test's ``backend="auto"`` or backend list sees them."""
    registry, added = get_registry(), []

    def add(backend: torchmux.Backend) -> torchmux.Backend:
        plugin = f"test_contract:{backend.name}:{id(backend)}"
        torchmux.register_plugin(backend, name=plugin)
        added.append((backend.name, plugin))
        return backend

    yield add
    for name, plugin in added:
        registry._entries.pop(name, None)
        registry.pm.unregister(name=plugin)


MUL_ADD = frozenset({"aten.mul.Tensor", "aten.add.Tensor"})


def f_mul_add_sum(x, y):
    return (x * y + 1).sum(-1)


# ---- contract version ---------------------------------------------------------------------------


def test_a_backend_for_a_newer_contract_is_refused_naming_the_plugin():
    class FromTheFuture:
        @torchmux.hookimpl
        def torchmux_add_backends(self):
            return [_Recording("future", contract_version=torchmux.extend.CONTRACT_VERSION + 1)]

    registry = Registry(autoload=False)
    newer = torchmux.extend.CONTRACT_VERSION + 1
    with pytest.warns(
        UserWarning, match=f"'future_plugin'.*written for torchmux backend contract {newer}.*upgrade torchmux"
    ):
        registry.register(FromTheFuture(), "future_plugin")
    assert "future" not in registry.names
    assert any(r.plugin == "future_plugin" and not r.available for r in registry.info())


def test_an_old_style_backend_without_the_new_attributes_still_runs(use):
    class OldStyle(torchmux.Backend):  # written against contract 1: ops, supports, compile and nothing else
        name = "old_style"
        ops = MUL_ADD
        auto = False

        def __init__(self):
            self.calls = 0

        def compile(self, request):
            forward = request.ir.gm.forward

            def run(*args):
                self.calls += 1
                return list(forward(*args))

            return run

    old = use(OldStyle())
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(torchmux.compile(f_mul_add_sum, backend="old_style")(x, y), f_mul_add_sum(x, y))
    assert old.calls >= 1 and old.contract_version == 1


# ---- options schema -----------------------------------------------------------------------------


def test_an_option_typo_is_refused_at_compile_time_with_the_allowed_names():
    with pytest.raises(
        torchmux.BadArgumentError,
        match=r"no option 'provders'\. Did you mean 'onnxruntime.providers'\?.*"
        r"intra_op_num_threads.*allow_spinning",
    ):
        torchmux.compile(torch.nn.Linear(2, 2), backend="onnxruntime", options={"onnxruntime.provders": ["CPU"]})
    with pytest.raises(torchmux.BadArgumentError, match=r"options\['tvm.tune_trials'\] must be int, got 'many'"):
        torchmux.compile(torch.nn.Linear(2, 2), options={"tvm": {"tune_trials": "many"}})
    with pytest.raises(torchmux.BadArgumentError, match="backend 'eager' has no option 'fast'"):
        torchmux.compile(torch.nn.Linear(2, 2), backend="eager", options={"eager.fast": True})


def test_declared_options_pass_and_free_form_options_are_not_checked(use):
    model = torch.nn.Linear(2, 2)
    torchmux.compile(
        model,
        options={
            "onnxruntime.intra_op_num_threads": 1,
            "tvm.tune_seconds": 3,
            "triton.autotune": True,
            "inductor.anything_goes": 1,
        },
    )
    free = use(_Recording("free_form", ops=MUL_ADD))  # no options_schema: an older plugin's options pass
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    out = torchmux.compile(f_mul_add_sum, backend="free_form", options={"free_form.whatever": 1})(x, y)
    torch.testing.assert_close(out, f_mul_add_sum(x, y))
    assert free.compiled


# ---- phases and granularity ---------------------------------------------------------------------


def test_a_graph_of_a_phase_the_backend_does_not_list_falls_back_and_says_why(use):
    inference_only = use(_Recording("inference_only", phases=frozenset({"inference"})))
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="compiles inference graphs only, not forward graphs"):
        out = torchmux.compile(model, backend="inference_only")(x)
    out.sum().backward()
    expected = torch.autograd.grad(model(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)
    assert inference_only.compiled == []


def test_whole_graph_granularity_refuses_a_graph_with_an_unclaimed_op(use):
    whole = use(_Recording("whole_only", ops=MUL_ADD, granularity="graph"))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.warns(
        torchmux.TorchmuxFallbackWarning, match="whole graphs only, and does not claim aten.sum.dim_IntList"
    ):
        out = torchmux.compile(f_mul_add_sum, backend="whole_only")(x, y)
    torch.testing.assert_close(out, f_mul_add_sum(x, y))
    assert whole.compiled == []


def test_op_granularity_compiles_each_claimed_op_on_its_own(use):
    per_op = use(_Recording("per_op", granularity="ops"))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(torchmux.compile(f_mul_add_sum, backend="per_op")(x, y), f_mul_add_sum(x, y))
    assert per_op.compiled and all(len(ops) == 1 for ops in per_op.compiled)
    assert len(per_op.compiled) == 3  # mul, add, sum: three one-op regions


def test_regions_smaller_than_min_region_ops_run_eagerly(use):
    picky = use(_Recording("picky", ops=MUL_ADD, min_region_ops=3))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match=r"claims no region of 3\+ ops that move data"):
        out = torchmux.compile(f_mul_add_sum, backend="picky")(x, y)
    torch.testing.assert_close(out, f_mul_add_sum(x, y))
    assert picky.compiled == []


# ---- cost estimates, kernel_count, explain ------------------------------------------------------


def test_auto_skips_a_candidate_whose_estimate_is_far_worse_without_compiling_it(use):
    hopeless = use(_Recording("hopeless", estimate_seconds=lambda request: 1.0))
    hopeful = use(_Recording("hopeful", estimate_seconds=lambda request: 1e-5))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    report = torchmux.explain(f_mul_add_sum, x, y, backend=["hopeless", "hopeful", "eager"])
    assert hopeless.compiled == [] and hopeful.compiled
    assert any(
        "hopeless: failed (skipped: its estimate 1e+03 ms is 10x+ hopeful's 0.01 ms)" in m
        for m in report.graphs[0].measurements
    ), report.graphs[0].measurements


def test_explain_names_the_ops_left_to_eager_and_reports_kernel_count(use):
    use(_Recording("mul_add_only", ops=MUL_ADD))
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    report = torchmux.explain(lambda a, b: (a * b + 1).sum(-1) * 2 + (a * b + 1).amax(-1), x, y, backend="mul_add_only")
    placement = report.graphs[0].placements[0]
    assert "ops eager (aten.amax.default, aten.sum.dim_IntList)" in placement, placement
    assert report.graphs[0].kernels is not None and report.graphs[0].kernels >= 2
    assert "aten.amax.default" in str(report)


def test_kernel_count_is_read_only_when_it_is_a_count():
    fn = lambda: None  # noqa: E731
    assert torchmux.extend.kernel_count_of(fn) is None
    fn.kernel_count = 4
    assert torchmux.extend.kernel_count_of(fn) == 4
    fn.kernel_count = "four"
    assert torchmux.extend.kernel_count_of(fn) is None


# ---- registration -------------------------------------------------------------------------------


def test_register_plugin_takes_a_backend_and_refuses_an_object_without_hooks(use):
    use(_Recording("bare_backend"))
    assert "bare_backend" in get_registry().names
    with pytest.raises(torchmux.PluginError, match="has no torchmux_\\* hook"):
        torchmux.register_plugin(object())


def test_a_builtin_named_again_in_TORCHMUX_PLUGINS_stays(monkeypatch):
    monkeypatch.setenv("TORCHMUX_PLUGINS", "torchmux.backends.eager,torchmux.backends.inductor")
    registry = Registry()
    assert {"eager", "inductor"} <= set(registry.names)
    assert not [p for p in registry.problems if p.package == "TORCHMUX_PLUGINS"]
    assert registry.get("eager").__class__.__name__ == "EagerBackend"


def test_unknown_backend_from_a_broken_TORCHMUX_PLUGINS_module_says_it_is_broken(monkeypatch, tmp_path):
    (tmp_path / "numpy_backend_plugin.py").write_text("import no_such_library_for_numpy_backend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TORCHMUX_PLUGINS", "numpy_backend_plugin")
    with pytest.warns(UserWarning, match="broken and was skipped"):
        registry = Registry()
    with pytest.raises(torchmux.UnknownBackendError) as info:
        registry.get("numpy")
    message = str(info.value)
    assert "plugin 'numpy_backend_plugin' (from TORCHMUX_PLUGINS) is broken" in message
    assert "No module named 'no_such_library_for_numpy_backend'" in message
    assert "pip-installed" not in message
    sys.modules.pop("numpy_backend_plugin", None)


# ---- prepare ------------------------------------------------------------------------------------


class _Preparing(_Recording):
    def prepare(self, device):
        self.prepared.append((device, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("no library here")


def _wait_for_prepare():
    for thread in threading.enumerate():
        if thread.name == "torchmux-prepare":
            thread.join()


def test_compile_prepares_each_backend_once_per_process_in_the_background_and_ignores_failures(use):
    ok = use(_Preparing("prep_ok", prepared=[], fail=False, ops=MUL_ADD))
    bad = use(_Preparing("prep_bad", prepared=[], fail=True, ops=MUL_ADD))
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(2):  # a second compile in the same process prepares nothing again
        f = torchmux.compile(f_mul_add_sum, backend=["prep_ok", "prep_bad"], options={"isolate": "off"})
        _wait_for_prepare()
        torch.testing.assert_close(f(x, y), f_mul_add_sum(x, y))  # the failed prepare changed nothing
    assert ok.prepared == [("cpu", "torchmux-prepare")] and bad.prepared == [("cpu", "torchmux-prepare")]


def test_a_pip_installed_plugins_prepare_runs_in_the_users_process_only_when_its_trials_are_not_isolated():
    example = pytest.importorskip(
        "torchmux_example_plugin", reason="pip install -e tests/plugins/torchmux-example-plugin"
    )
    from torchmux.core import backend

    backend._PREPARED.discard(("example", "cpu"))
    example.PREPARED.clear()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torchmux.compile(f_mul_add_sum, backend="example", options={"isolate": "third-party"})(x, y)
    _wait_for_prepare()
    assert example.PREPARED == []  # its code runs in the trial child first
    torchmux.compile(f_mul_add_sum, backend="example", options={"isolate": "off"})
    _wait_for_prepare()
    assert example.PREPARED == ["cpu"]


def test_inductor_prepare_probes_the_cpu_so_its_first_compile_does_not():
    from torch._inductor import cpu_vec_isa

    from torchmux.backends.inductor import InductorBackend

    InductorBackend().prepare("cpu")
    assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1  # the probe's answer, kept for the process
