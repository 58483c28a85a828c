"""Shared test setup.

- Without a CUDA GPU, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 must be set
  before anything imports triton, so it is set here, first (importing torch does not import triton).
  With one, kernels are compiled for it: the interpreter on CUDA tensors is not what users run
  (Inductor's kernels gave wrong answers there).
- Every on-disk cache goes to a fresh folder for the test session (TORCHMUX_CACHE_DIR), so tests never
  read a cache an earlier run left and a second process started by a test finds this run's cache;
  the key that signs cached libraries (TORCHMUX_KEY_FILE) is a fresh one beside it.
- Tests marked ``gpu`` skip without a CUDA device.
"""

from __future__ import annotations

import os
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHMUX_CACHE_DIR", tempfile.mkdtemp(prefix="torchmux-test-cache-"))
# the per-user key that signs cached libraries: a fresh one, outside the cache, never the user's own
os.environ.setdefault("TORCHMUX_KEY_FILE", os.path.join(tempfile.mkdtemp(prefix="torchmux-test-key-"), "key"))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible to torch); runs on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ------------------------------------------------------------------------------------------ fleet
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real ``redis-server`` on a free local port, in a temporary folder, persisting nothing."""

    def __init__(self, folder: str) -> None:
        import shutil
        import subprocess
        import time

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed here (apt-get install redis-server; .ci/run installs it)")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                folder,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install 'torchmux[fleet]')")
        self.client = redis.Redis(port=self.port, socket_timeout=2)
        for _ in range(100):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A fresh redis-server for one test, killed after it (or by the test, mid-run)."""
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield server
    server.kill()


# ------------------------------------------------------------------------------------------ failure log
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With TORCHMUX_FAIL_LOG set, each failure is written to that file as it happens (the GPU machine's
    runs end at a hard time limit, before pytest's summary): the test, its error line, then its traceback's
    last lines."""
    path = os.environ.get("TORCHMUX_FAIL_LOG")
    if not path or not report.failed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    text = report.longreprtext
    with open(path, "a") as f:
        f.write(f"### {report.nodeid} [{report.when}]\n{crash.message if crash else ''}\n{text[-2500:]}\n\n")
