# cold-start cost of one isolated trial (child start + rebuild + compile + 2 calls), and of a remembered verdict
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2] / "tests" / "autotune"))
import faulty_backends  # type: ignore[import-not-found]  # tests/autotune, put on sys.path above

import torchmux
from torchmux.autotune import isolate
from torchmux.core.registry import get_registry
from torchmux.core.trace import trace

torchmux.register_plugin(faulty_backends, "faulty_backends")
ir = trace(lambda x: torch.relu(x) * 2 + 1, [torch.randn(4, 8)])
b = get_registry().get("fault_wrong_nan")
for label in ("cold", "remembered"):
    t0 = time.perf_counter()
    v = isolate.trial(ir, ("sig",), b, [torch.randn(4, 8)], mode=None, options={}, deadline=60)
    print(label, f"{time.perf_counter() - t0:.2f} s", v)
