"""core/registry.py and core/hookspecs.py: discovery, isolation of broken plugins, errors."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchmux
from torchmux.core.registry import Registry, get_registry

PLUGIN_DIST = "torchmux-example-plugin"


def _plugin_installed() -> bool:
    try:
        importlib.metadata.version(PLUGIN_DIST)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


needs_plugin = pytest.mark.skipif(
    not _plugin_installed(),
    reason=f"{PLUGIN_DIST} is not installed: run `pip install -e tests/plugins/torchmux-example-plugin` "
    "(the README's test command does)",
)


def test_builtin_backends_come_from_the_entry_point_group():
    eps = {ep.name: ep.dist.name for ep in importlib.metadata.entry_points(group="torchmux.backends")}
    rows = {r.name: r for r in torchmux.list_backends()}
    for name in ("eager", "inductor", "cudagraphs"):
        assert eps[name] == "torchmux"
        assert rows[name].package == "torchmux" and rows[name].plugin == name


def test_list_backends_says_why_not():
    rows = {r.name: r for r in torchmux.list_backends()}
    assert rows["eager"].available and rows["eager"].reason == ""
    assert rows["eager"].version == torch.__version__
    if not torch.cuda.is_available():
        assert not rows["cudagraphs"].available
        assert "CUDA" in rows["cudagraphs"].reason


def test_cli_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "torchmux", "list"], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].split()[:4] == ["backend", "version", "devices", "available"]
    assert any(line.startswith("eager ") for line in out.splitlines())


@needs_plugin
def test_installed_third_party_plugin_is_discovered_and_runs():
    from torchmux_example_plugin import CALLS

    rows = {r.name: r for r in torchmux.list_backends()}
    assert rows["example"].available and rows["example"].package == PLUGIN_DIST

    def f(x, y):
        return torch.relu(x * y + 1).sum(-1)  # sum is not claimed: it runs eagerly around the plugin's region

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    before = CALLS["count"]
    out = torchmux.compile(f, backend="example")(x, y)
    torch.testing.assert_close(out, f(x, y))
    assert CALLS["count"] > before


@needs_plugin
def test_broken_plugins_are_reported_and_everything_else_works():
    with pytest.warns(UserWarning, match="broken and was skipped"):
        registry = Registry()
    problems = {p.plugin: p.error for p in registry.problems}
    assert "ImportError" in problems["example_import_error"]
    assert "device_count" in problems["example_bad_hook"]  # pluggy names the offending argument
    assert {"eager", "example"} <= set(registry.names)
    rows = {r.name: r for r in registry.info()}
    assert not rows["(example_import_error)"].available


def test_plugin_registered_at_run_time_is_validated():
    class BadPlugin:
        @torchmux.hookimpl
        def torchmux_add_backends(self, nonsense):
            return []

    with pytest.raises(torchmux.PluginError, match="nonsense"):
        Registry(autoload=False).register(BadPlugin(), "bad")


def test_duplicate_backend_names_are_refused():
    class Dup:
        @torchmux.hookimpl
        def torchmux_add_backends(self):
            return [type("E", (torchmux.Backend,), {"name": "eager"})()]

    registry = Registry()
    with pytest.warns(UserWarning, match="already taken"):
        registry.register(Dup(), "dup")
    assert registry.get("eager").__class__.__name__ == "EagerBackend"


def test_autoload_switch_keeps_builtins_and_drops_third_party():
    script = textwrap.dedent(
        """
        import warnings, torchmux
        warnings.simplefilter("ignore")
        print(",".join(sorted(r.name for r in torchmux.list_backends())))
        """
    )
    env = dict(os.environ, TORCHMUX_DISABLE_PLUGIN_AUTOLOAD="1")
    names = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    names = set(names.strip().split(","))
    assert {"eager", "inductor"} <= names
    assert not any(n.startswith("example") or "(example" in n for n in names)


def test_import_list_and_compile_work_without_the_optional_backends():
    """``import torchmux`` needs torch and pluggy only: with onnxruntime, onnx, tvm and triton absent
    (``sys.modules[name] = None`` makes their import fail as if uninstalled), the backends say what to
    install and the rest works."""
    code = textwrap.dedent("""
        import sys
        for name in ("onnxruntime", "onnx", "onnxscript", "tvm", "tvm_ffi", "triton"):
            sys.modules[name] = None
        import torch, torchmux
        records = {r.name: r for r in torchmux.list_backends()}
        for name in ("onnxruntime", "tvm", "triton"):
            assert not records[name].available and "pip install" in records[name].reason, records[name]
        assert records["eager"].available and records["inductor"].available
        f = torchmux.compile(lambda x: torch.relu(x) * 2, backend="eager")
        x = torch.randn(4)
        assert torch.equal(f(x), torch.relu(x) * 2)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_unknown_backend_lists_known_ones():
    with pytest.raises(torchmux.UnknownBackendError, match="Known backends: .*eager.*inductor"):
        torchmux.compile(torch.nn.Linear(2, 2), backend="no-such-backend")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_unavailable_backend_says_why():
    with pytest.raises(torchmux.BackendUnavailableError, match="cannot run here: no CUDA GPU"):
        torchmux.compile(torch.nn.Linear(2, 2), backend="cudagraphs")


def test_hook_observers_see_graphs_and_measurements():
    seen = {"graphs": [], "measured": []}

    class Observer:
        @torchmux.hookimpl
        def torchmux_graph_captured(self, ir):
            seen["graphs"].append(ir.fingerprint())

        @torchmux.hookimpl
        def torchmux_candidate_measured(self, backend, ok):
            seen["measured"].append((backend, ok))

    registry = get_registry()
    registry.pm.register(Observer(), name="observer")
    try:
        f = torchmux.compile(lambda x: torch.tanh(x) * 2, backend="eager", options={"verify": True})
        f(torch.randn(3))
        f2 = torchmux.compile(lambda x: torch.sin(x) + 1, backend=["eager"])
        f2(torch.randn(3))
    finally:
        registry.pm.unregister(name="observer")
    assert len(seen["graphs"]) == 2
    assert ("eager", True) in seen["measured"]


@needs_plugin
def test_one_plugin_is_opened_without_discovering_the_others():
    """What torchmux.load does: the plugin a package names, read from its own distribution's entry points,
    in a fresh process: no other plugin module is imported, and a broken one elsewhere is never touched."""
    script = textwrap.dedent(
        """
        import sys, warnings, json
        warnings.simplefilter("error")  # the broken example plugins would warn if they were loaded
        from torchmux.core.registry import find_backend, Registry
        ours = find_backend("eager", "eager", "torchmux")
        theirs = find_backend("example", "example", "torchmux-example-plugin")
        print(json.dumps({
            "eager": type(ours).__name__, "example": theirs.name,
            "modules": sorted(n for n in sys.modules if n.startswith(("torchmux.backends.", "torchmux_example"))),
        }))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert got["eager"] == "EagerBackend" and got["example"] == "example"
    assert got["modules"] == ["torchmux.backends.eager", "torchmux_example_plugin"]
    env = dict(os.environ, TORCHMUX_DISABLE_PLUGIN_AUTOLOAD="1")  # the switch holds on this path too
    check = "from torchmux.core.registry import Registry; print(Registry.of_plugin('example', 'torchmux-example-plugin').names)"
    names = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True).stdout
    assert names.strip() == "[]"


def test_find_backend_of_a_backend_nobody_provides_is_none():
    from torchmux.core.registry import find_backend

    assert find_backend("no-such-backend", "no-such-plugin", "no-such-distribution") is None
    assert find_backend("eager", "eager", "torchmux") is get_registry().get("eager")


def test_a_row_lists_the_devices_the_backend_runs_on_here():
    """A backend that declares CUDA but cannot run it here (ONNX Runtime's CPU-only wheel has no CUDA
    provider) lists the CPU alone; its own check failing leaves its declared devices."""

    class CpuOnlyHere(torchmux.Backend):
        name, devices = "cpu_only_here", ("cpu", "cuda")

        def supports_device(self, device: str) -> bool:
            return device == "cpu"

    class CheckFails(torchmux.Backend):
        name, devices = "check_fails", ("cpu", "cuda")

        def supports_device(self, device: str) -> bool:
            raise RuntimeError("no driver")

    class Plugin:
        @torchmux.hookimpl
        def torchmux_add_backends(self):
            return [CpuOnlyHere(), CheckFails()]

    registry = Registry(autoload=False)
    registry.register(Plugin(), "devices")
    rows = {r.name: r for r in registry.info()}
    assert rows["cpu_only_here"].devices == ("cpu",)
    assert rows["check_fails"].devices == ("cpu", "cuda")
