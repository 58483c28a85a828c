"""A plugin author's first hour, each step as the docs promise it: a plugin without a claims file
imports and says what to do; the probe takes the backend object; a refusal names the dtype; a
TORCHMUX_PLUGINS module is listed under its distribution; disabled autoload is named; the request
says the thread budget; a demotion is listed and cleared with ``torchmux cache demotions``."""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path

import pytest
import torch

import torchmux
from torchmux import extend
from torchmux.api.cache_cli import main as cache_main
from torchmux.testing.probe import probe


class _Adds(extend.Backend):
    contract_version = extend.CONTRACT_VERSION
    dtypes = (torch.float32,)
    auto = False

    def __init__(self, name: str, **attrs) -> None:
        self.name, self.requests = name, []
        for k, v in attrs.items():
            setattr(self, k, v)

    def compile(self, request):
        self.requests.append(request)
        forward = request.ir.gm.forward
        return lambda *args: list(forward(*args))


def _compile_warnings(backend: extend.Backend, *inputs: torch.Tensor, **options) -> list[str]:
    torchmux.register_plugin(backend)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torchmux.compile(lambda a, b: a + b, backend=backend.name, options={"isolate": "off", **options})(*inputs)
    return [str(w.message) for w in seen if issubclass(w.category, torchmux.TorchmuxFallbackWarning)]


def test_a_missing_claims_file_claims_nothing_and_says_how_to_write_it(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    with pytest.warns(UserWarning, match=r"does not exist yet.*python -m torchmux\.testing\.probe"):
        claims = extend.load_claims(path)
    assert claims == {} and extend.load_nonfinite_unsafe(path) == frozenset()
    fallbacks = _compile_warnings(_Adds("author_no_claims", claims=claims), torch.randn(4), torch.randn(4))
    assert len(fallbacks) == 1 and f"its claims file {path} does not exist yet" in fallbacks[0], fallbacks
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        extend.load_claims(path)


def test_a_dtype_refusal_names_the_dtype() -> None:
    backend = _Adds("author_f32_only", ops=frozenset({"aten.add.Tensor"}))
    half = torch.randn(4).half()
    (fallback,) = _compile_warnings(backend, half, half)
    assert "it computes in float16, and the backend's dtypes are float32" in fallback, fallback
    claimed = _Adds(
        "author_claims_f32", dtypes=(torch.float32, torch.float16), claims={"float32": frozenset({"aten.add.Tensor"})}
    )
    (fallback,) = _compile_warnings(claimed, half, half)
    assert "claimed in float32, not in float16" in fallback, fallback


def test_the_probe_takes_the_backend_object_and_leaves_its_claims_alone() -> None:
    backend = _Adds("author_probe", ops=frozenset())
    passed, failed = probe(backend, [torch.float32, torch.float16], nonfinite=False)
    assert backend.ops == frozenset()  # probed on a copy claiming everything
    assert "aten.add.Tensor" in passed["float32"] and passed["float16"] == []
    assert any("float16 is not in the backend's dtypes (float32)" in line for line in failed), failed[:3]


def test_the_request_carries_the_thread_budget() -> None:
    backend = _Adds("author_threads")
    _compile_warnings(backend, torch.randn(4), torch.randn(4))
    assert backend.requests and backend.requests[0].threads == torch.get_num_threads()


def test_disabled_autoload_is_named_in_the_unknown_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchmux.core.registry import Registry

    monkeypatch.setenv("TORCHMUX_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(torchmux.UnknownBackendError) as info:
        Registry().get("some_plugin_backend")
    assert "TORCHMUX_DISABLE_PLUGIN_AUTOLOAD is set" in str(info.value) and "TORCHMUX_PLUGINS" in str(info.value)
    assert "pip-installed" not in str(info.value)


def test_a_TORCHMUX_PLUGINS_module_is_listed_under_its_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        importlib.metadata.version("torchmux-example-plugin")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchmux-example-plugin is not installed (pip install -e tests/plugins/torchmux-example-plugin)")
    from torchmux.core.registry import Registry

    monkeypatch.setenv("TORCHMUX_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("TORCHMUX_PLUGINS", "torchmux_example_plugin")
    rows = {r.name: r for r in Registry().info()}
    assert rows["example"].package == "torchmux-example-plugin" and rows["example"].plugin == "torchmux_example_plugin"


class _TurnsWrong(_Adds):
    """Right on its trial calls and the user's first call, wrong from the user's second on."""

    def compile(self, request):
        forward, calls = request.ir.gm.forward, [0]

        def run(*args):
            calls[0] += 1
            return [o + (1 if calls[0] > 3 else 0) for o in forward(*args)]

        return run


def test_a_demotion_is_listed_and_cleared_by_the_cache_cli(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    backend = _TurnsWrong("author_turns_wrong")
    torchmux.register_plugin(backend)
    torch._dynamo.reset()
    f = torchmux.compile(lambda a, b: a * b, backend=backend.name, options={"isolate": "off"})
    x = torch.randn(4)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="demoted"):
        outs = [f(x, x) for _ in range(8)]
    # calls 1 and 8 are checked (autotune/verify.py): 2-7 return its wrong answers, 8 is caught and answered right
    torch.testing.assert_close(outs[0], x * x)
    torch.testing.assert_close(outs[7], x * x)
    assert all(not torch.allclose(o, x * x) for o in outs[1:7])
    assert cache_main(["demotions"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("1 demotion records and 1 failed verdicts"), listed  # the graph, and its structure
    assert "author_turns_wrong -" in listed and "wrong answer" in listed
    assert cache_main(["demotions", "--clear", "--backend", "someone_else"]) == 0
    assert "removed 0 demotion records and 0 failed verdicts" in capsys.readouterr().out
    assert cache_main(["demotions", "--clear", "--backend", "author_turns_wrong"]) == 0
    assert "removed 1 demotion records and 1 failed verdicts of author_turns_wrong" in capsys.readouterr().out
    assert not list((tmp_path / "demoted").glob("*.json"))
    assert not any('"ok": false' in p.read_text() for p in (tmp_path / "verdicts").glob("*.json"))
