"""The tuning progress bar (autotune/progress.py): on a terminal it names the graph and the candidate,
and a one-line summary closes each graph; in a log (stderr not a terminal) nothing is printed."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

PROGRAM = """
import torch, torchmux
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
with torch.no_grad():
    torchmux.compile(model, backend=["eager", "onnxruntime"])(torch.randn(2, 8))
"""


def _run(cache: Path, terminal: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(TORCHMUX_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    if not terminal:
        return subprocess.run(
            [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300, check=True
        ).stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 wide
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_bar_and_summary_on_a_terminal(tmp_path: Path) -> None:
    out = _run(tmp_path / "tty", terminal=True)
    assert "torchmux " in out and "compile onnxruntime" in out, out[-2000:]
    summary = [line for line in out.splitlines() if "won among 2 backends" in line]
    assert summary and "eager:" in summary[0] and "onnxruntime:" in summary[0], out[-2000:]


def test_quiet_in_a_log(tmp_path: Path) -> None:
    err = _run(tmp_path / "log", terminal=False)
    assert "won among" not in err and "compile onnxruntime" not in err
