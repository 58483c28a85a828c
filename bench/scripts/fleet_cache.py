"""Two machines, one Redis: the cold compile on machine A, then the warm one on machine B.

    python -m torchmux.bench.scripts.fleet_cache [--backend auto] [--port 6390]

Starts a redis-server on ``--port`` (a temporary one, persisting nothing), then runs the same model
twice in fresh processes, each with its own TORCHMUX_CACHE_DIR (two folders stand in for two
machines) and TORCHMUX_REMOTE_CACHE pointing at that server, and B once more (its local cache warm).
Prints, per run, the seconds from ``torchmux.compile`` to the first answer, how many candidates it
measured and the backend it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MACHINE = r"""
import json, time, torch, torchmux
from torchmux.core.registry import get_registry
measured = []
class Observer:
    @torchmux.hookimpl
    def torchmux_candidate_measured(self, ir, backend, seconds, ok, reason):
        measured.append(backend)
get_registry().register(Observer(), "fleet_observer")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                            torch.nn.Linear(512, 256)).eval()
x = torch.randn(32, 256)
with torch.no_grad():
    t0 = time.perf_counter()
    out = torchmux.compile(model, backend=BACKEND)(x)
    seconds = time.perf_counter() - t0
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
print(json.dumps({"seconds": seconds, "measured": len(measured)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--port", type=int, default=6390)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server is not installed (apt-get install redis-server)", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="torchmux-fleet-")
    server = subprocess.Popen(
        [binary, "--port", str(args.port), "--bind", "127.0.0.1", "--dir", work, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        code = MACHINE.replace("BACKEND", repr(args.backend))
        for name in ("A", "B", "B"):  # the second run on B: its own local cache is warm now
            env = {
                **os.environ,
                "TORCHMUX_CACHE_DIR": os.path.join(work, f"machine{name}"),
                "TORCHMUX_REMOTE_CACHE": f"redis://127.0.0.1:{args.port}/0",
            }
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            folder = os.path.join(work, f"machine{name}", "decisions")
            winners = sorted({json.loads(Path(folder, f).read_text())["backend"] for f in os.listdir(folder)})
            print(
                f"machine {name}: compile to first answer {result['seconds']:.2f} s, "
                f"{result['measured']} candidates measured, running on {', '.join(winners)}"
            )
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
