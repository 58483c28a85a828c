"""``torchmux cache`` (api/cache_cli.py): ls, clear, export/import (checked bundles), stats."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

import torchmux
from torchmux.api.cache_cli import BundleError, import_bundle, main
from torchmux.core import remote_cache
from torchmux.core.artifacts import authentic
from torchmux.core.registry import get_registry

BACKENDS = ["eager", "onnxruntime"]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.a(x)) * 2


def _compile_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(folder))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(4, 12)
    with torch.no_grad():
        return torchmux.compile(model, backend=BACKENDS)(x), model(x)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding one tuned model: a decision and an ONNX model."""
    folder = tmp_path_factory.mktemp("tuned")
    with pytest.MonkeyPatch.context() as mp:
        _compile_in(folder, mp)
    return folder


def _run(monkeypatch: pytest.MonkeyPatch, folder: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(folder))
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_ls_through_the_command(tuned: Path) -> None:
    env = {**os.environ, "TORCHMUX_CACHE_DIR": str(tuned)}
    out = subprocess.run(
        [sys.executable, "-m", "torchmux", "cache", "ls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "decisions: 1" in out
    record = json.loads(next((tuned / "decisions").glob("*.json")).read_text())
    assert f"-> {record['backend']}" in out and record["graph"] in out
    assert "eager " in out and "onnxruntime " in out and " ms" in out  # each candidate's measurement
    assert "onnxruntime/" in out and "KiB" in out and "ago" in out  # artifact sizes and ages


def test_export_then_import_on_a_fresh_machine(tuned: Path, tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    bundle = tmp_path / "tuned.tar.gz"
    out = _run(monkeypatch, tuned, capsys, "export", str(bundle))
    assert "1 decision" in out and "onnx" in out
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert "MANIFEST.json" in names
    assert all(n.startswith(("decisions/", "onnxruntime/")) or n == "MANIFEST.json" for n in names), names

    fresh = tmp_path / "air-gapped"
    out = _run(monkeypatch, fresh, capsys, "import", str(bundle))
    assert "imported" in out
    for rel in names[1:]:
        assert (fresh / rel).read_bytes() == (tuned / rel).read_bytes()
        assert not rel.endswith(".onnx") or authentic(fresh / rel)  # loadable: ONNX Runtime checks the digest

    seen: list[str] = []

    class Observer:
        @torchmux.hookimpl
        def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):  # type: ignore[no-untyped-def]
            seen.append(backend)

    get_registry().register(Observer(), "test_cache_cli_observer")
    try:
        got, want = _compile_in(fresh, monkeypatch)
    finally:
        get_registry().pm.unregister(name="test_cache_cli_observer")
    torch.testing.assert_close(got, want)
    assert seen == [], "the imported decision spared every measurement"


def _bundle(
    path: Path, members: dict[str, bytes], *, manifest: dict[str, str] | None = None, link: str | None = None
) -> Path:
    files = {k: hashlib.sha256(v).hexdigest() for k, v in members.items()} if manifest is None else manifest
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [("MANIFEST.json", json.dumps({"format": 1, "files": files}).encode()), *members.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return path


GOOD = json.dumps({"backend": "eager", "plan": None, "measurements": [{"backend": "eager", "seconds": 1e-5}]}).encode()
KEY = "decisions/" + "a" * 32 + ".json"


@pytest.mark.parametrize(
    "members, manifest, link, why",
    [
        ({"../../evil.json": GOOD}, None, None, "not something a bundle may hold"),
        ({"/etc/cron.d/x": GOOD}, None, None, "not something a bundle may hold"),
        ({"tvm/lib/" + "b" * 32 + ".so": b"\x7fELF"}, None, None, "not something a bundle may hold"),
        ({KEY: GOOD}, {KEY: "0" * 64}, None, "does not match the SHA-256"),
        ({KEY: b'{"backend": 3}'}, None, None, "not a valid torchmux decision"),
        ({"onnxruntime/" + "c" * 32 + "/model.onnx": b"#!/bin/sh"}, None, None, "not an ONNX model"),
        ({KEY: GOOD}, None, "decisions/" + "d" * 32 + ".json", "not a plain file"),
    ],
)
def test_import_refuses_a_bad_bundle_and_writes_nothing(tmp_path, members, manifest, link, why) -> None:  # type: ignore[no-untyped-def]
    bundle = _bundle(tmp_path / "bad.tar.gz", members, manifest=manifest, link=link)
    root = tmp_path / "cache"
    with pytest.raises(BundleError, match=why):
        import_bundle(root, bundle)
    assert not root.exists() or not any(root.rglob("*"))


def test_import_of_something_else_says_so(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "model.pt").write_bytes(b"not a tar")
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["import", str(tmp_path / "model.pt")]) == 1
    assert "is not a torchmux cache bundle" in capsys.readouterr().err


def test_clear_older_than(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    old, new = tmp_path / "decisions" / "old.json", tmp_path / "onnxruntime" / "k" / "model.onnx"
    for f in (old, new):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    assert "removed 1 files" in _run(monkeypatch, tmp_path, capsys, "clear", "--older-than", "7d")
    assert not old.exists() and new.exists()
    assert "removed 1 files" in _run(monkeypatch, tmp_path, capsys, "clear")
    assert not new.exists()
    with pytest.raises(SystemExit):
        main(["clear", "--older-than", "a week"])
    assert "write e.g. 90s, 30m, 12h, 7d" in capsys.readouterr().err


def test_stats_counts_local_and_remote(redis_server, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHMUX_CACHE_DIR", str(tmp_path / "elsewhere"))
    remote_cache.flush_stats()  # earlier tests' counts go elsewhere
    remote_cache.reset()
    monkeypatch.setenv("TORCHMUX_REMOTE_CACHE", redis_server.url)
    _compile_in(tmp_path / "a", monkeypatch)  # tunes, writes both levels
    _compile_in(tmp_path / "b", monkeypatch)  # misses locally, hits remotely
    out = _run(monkeypatch, tmp_path / "b", capsys, "stats")
    local, remote = out.splitlines()
    hits = int(remote.split(": ")[1].split()[0])
    assert hits >= 1, out  # the decision (and the ONNX model, when onnxruntime won)
    assert "misses" in local and "on disk" in local and redis_server.url in remote
    assert json.loads((tmp_path / "b" / "stats.json").read_text())["remote_bytes_read"] > 0
