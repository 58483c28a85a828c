"""The fleet's shared cache (core/remote_cache.py) against a real redis-server started for each test.

Two cache folders stand in for two machines sharing one Redis: machine A compiles and tunes, machine B
compiles the same model and measures nothing. A server killed mid-run, one that is not there and
entries that are garbage cost a warning and a local compile, never a wrong or failed call.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pytest
import torch

import torchmux
from torchmux.autotune import decisions
from torchmux.core import remote_cache
from torchmux.core.errors import TorchmuxRemoteCacheWarning
from torchmux.core.machine import machine_kind
from torchmux.core.registry import get_registry

BACKENDS = ["eager", "onnxruntime"]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x))).softmax(-1)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    remote_cache.reset()
    monkeypatch.setenv("TORCHMUX_REMOTE_TIMEOUT", "0.2")
    torch._dynamo.reset()


@pytest.fixture
def measured():  # type: ignore[no-untyped-def]
    """Every candidate the autotuner measures during the test: (graph, backend)."""
    seen: list[tuple[str, str]] = []

    class Observer:
        on_measure = None

        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):  # type: ignore[no-untyped-def]
            seen.append((ir.name, backend))
            if Observer.on_measure:
                Observer.on_measure()

    registry = get_registry()
    observer = Observer()
    registry.register(observer, "test_remote_cache_observer")
    yield seen, Observer
    registry.pm.unregister(name="test_remote_cache_observer")


def _machine(monkeypatch: pytest.MonkeyPatch, folder: Path, url: str | None) -> None:
    """Become another machine: another cache folder, and a fresh Dynamo (no compiled code kept)."""
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(folder))
    if url:
        monkeypatch.setenv("TORCHMUX_REMOTE_CACHE", url)
    torch._dynamo.reset()


def _compile_and_run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        return torchmux.compile(model, backend=BACKENDS)(x), model(x)


def test_machine_b_compiles_with_no_measurement(redis_server, measured, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen, _ = measured
    x = torch.randn(8, 16)
    _machine(monkeypatch, tmp_path / "a", redis_server.url)
    got, want = _compile_and_run(x)
    torch.testing.assert_close(got, want)
    assert seen, "machine A measured its candidates"
    keys = {k.decode() for k in redis_server.client.keys("torchmux:*")}
    assert any(k.startswith("torchmux:decisions/") for k in keys), keys
    assert any(k.endswith("/model.onnx") for k in keys), keys  # the ONNX model travels (data)

    seen.clear()
    hits = remote_cache.stats().get("remote_hits", 0)
    _machine(monkeypatch, tmp_path / "b", redis_server.url)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchmuxRemoteCacheWarning)
        got, want = _compile_and_run(x)
    torch.testing.assert_close(got, want)
    assert seen == [], f"machine B measured {seen}"
    decision = [json.loads(p.read_text()) for p in (tmp_path / "b" / "decisions").glob("*.json")]
    assert decision, "the decision came from Redis and is now in B's local cache"
    if decision[0]["backend"] == "onnxruntime":  # B ran the winner on A's ONNX model, exported nowhere else
        assert remote_cache.stats()["remote_hits"] >= hits + 2
        assert list((tmp_path / "b" / "onnxruntime").glob("*/model.onnx"))


def test_server_killed_mid_run(redis_server, measured, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The server dies while machine B tunes: one warning, a local compile, the right answer."""
    seen, observer = measured
    observer.on_measure = redis_server.kill
    _machine(monkeypatch, tmp_path / "b", redis_server.url)
    x = torch.randn(8, 16)
    t0 = time.perf_counter()
    with pytest.warns(TorchmuxRemoteCacheWarning, match="failed") as record:
        got, want = _compile_and_run(x)
    elapsed = time.perf_counter() - t0
    torch.testing.assert_close(got, want)
    assert seen
    assert len([w for w in record if issubclass(w.category, TorchmuxRemoteCacheWarning)]) == 1
    assert list((tmp_path / "b" / "decisions").glob("*.json")), "the local cache still got the decision"
    assert elapsed < 60


def test_no_server_costs_one_warning(measured, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _machine(monkeypatch, tmp_path / "c", f"redis://127.0.0.1:{port}/0")
    with pytest.warns(TorchmuxRemoteCacheWarning, match="compiling locally") as record:
        got, want = _compile_and_run(torch.randn(8, 16))
    torch.testing.assert_close(got, want)
    assert len([w for w in record if issubclass(w.category, TorchmuxRemoteCacheWarning)]) == 1


def test_garbage_in_redis_is_ignored(redis_server, measured, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen, _ = measured
    x = torch.randn(8, 16)
    _machine(monkeypatch, tmp_path / "a", redis_server.url)
    _compile_and_run(x)
    keys = redis_server.client.keys("torchmux:*")
    for i, key in enumerate(keys):  # another program's bytes, and torchmux's frame with a wrong checksum
        redis_server.client.set(key, b"not torchmux at all" if i % 2 else b"TMX1d" + bytes(32) + b'{"backend": "x"}')
    seen.clear()
    remote_cache.reset()
    _machine(monkeypatch, tmp_path / "b", redis_server.url)
    with pytest.warns(TorchmuxRemoteCacheWarning, match="ignoring the remote cache's entry"):
        got, want = _compile_and_run(x)
    torch.testing.assert_close(got, want)
    assert seen, "machine B measured again instead of trusting garbage"


def test_executables_travel_only_signed(redis_server, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHMUX_REMOTE_CACHE", redis_server.url)
    library = b"\x7fELF pretend shared library"
    remote_cache.write_bytes("tvm/lib/k.so", library, executable=True)
    assert redis_server.client.keys("*") == [], "no fleet key: an executable never leaves the machine"

    (tmp_path / "fleet.key").write_text("secret-of-the-fleet\n")
    monkeypatch.setenv("TORCHMUX_FLEET_KEY_FILE", str(tmp_path / "fleet.key"))
    remote_cache.write_bytes("tvm/lib/k.so", library, executable=True)
    assert remote_cache.read_bytes("tvm/lib/k.so", executable=True) == library
    redis_server.client.copy("torchmux:tvm/lib/k.so", "torchmux:tvm/lib/other.so")
    with pytest.warns(TorchmuxRemoteCacheWarning):  # a signature binds the path: no renaming a library
        assert remote_cache.read_bytes("tvm/lib/other.so", executable=True) is None

    (tmp_path / "other.key").write_text("another fleet")
    monkeypatch.setenv("TORCHMUX_FLEET_KEY_FILE", str(tmp_path / "other.key"))
    remote_cache.reset()
    with pytest.warns(TorchmuxRemoteCacheWarning, match="signed with this fleet key"):
        assert remote_cache.read_bytes("tvm/lib/k.so", executable=True) is None
    monkeypatch.delenv("TORCHMUX_FLEET_KEY_FILE")
    assert remote_cache.read_bytes("tvm/lib/k.so", executable=True) is None  # no key: not even asked


def test_bad_url_is_refused_with_what_to_write(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHMUX_REMOTE_CACHE", "localhost:6379")
    with pytest.raises(ValueError, match="redis://host:6379/0"):
        torchmux.compile(Net(), backend=BACKENDS)


def test_decision_key_names_the_machine_kind(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        model = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("model name"))
        assert model.split(":", 1)[1].strip() in machine_kind("cpu")
    sig = ((torch.Size([3]), torch.float32, torch.device("cpu")),)

    class FakeIR:  # the key's other parts held fixed; only the machine changes
        def fingerprint(self) -> str:
            return "f"

    here = decisions.decision_key(FakeIR(), sig, [], None)  # type: ignore[arg-type]
    monkeypatch.setattr(decisions, "machine_kind", lambda device: "cpu:Another CPU x64")
    assert decisions.decision_key(FakeIR(), sig, [], None) != here  # type: ignore[arg-type]


@pytest.mark.slow
def test_tvm_library_travels_signed_only(redis_server, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A TVM shared library reaches machine B only with the fleet key; without it B rebuilds it."""
    pytest.importorskip("tvm")
    x = torch.randn(4, 16)
    (tmp_path / "fleet.key").write_text("secret-of-the-fleet")
    monkeypatch.setenv("TORCHMUX_FLEET_KEY_FILE", str(tmp_path / "fleet.key"))

    def compile_on(folder: Path) -> None:
        _machine(monkeypatch, folder, redis_server.url)
        torch.manual_seed(0)
        model = Net().eval()
        with torch.no_grad():
            # in-process (no isolated trial): the remote-cache counters read below are this process's
            compiled = torchmux.compile(model, backend="tvm", options={"isolate": "off"})
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)

    compile_on(tmp_path / "a")
    libraries = [k.decode() for k in redis_server.client.keys("torchmux:tvm/lib/*.so")]
    assert libraries, "machine A shared its library, signed"
    hits = remote_cache.stats().get("remote_hits", 0)
    compile_on(tmp_path / "b")
    assert remote_cache.stats()["remote_hits"] >= hits + 2  # the library and its metadata came from Redis
    so = tmp_path / "b" / libraries[0].removeprefix("torchmux:")
    assert so.read_bytes() == (tmp_path / "a" / so.relative_to(tmp_path / "b")).read_bytes()  # fetched, not rebuilt

    monkeypatch.delenv("TORCHMUX_FLEET_KEY_FILE")
    compile_on(tmp_path / "c")  # no key: the library is built here, the data (its metadata) still shared
    assert (tmp_path / "c" / so.relative_to(tmp_path / "b")).exists()
    assert remote_cache.read_bytes(libraries[0].removeprefix("torchmux:"), executable=True) is None
