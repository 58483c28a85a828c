# What each verify policy costs a user's call in steady state, and when a backend that turns wrong is
# caught (README "What verify promises", plugins.md section 2 quote these figures). For each zoo model:
# torchmux.compile(model, backend=B, options={"verify": P}) for P in off, sparse, always, one process,
# the three compiled models called in interleaved bursts of 200 calls (11 rounds, medians per call).
#   python -m torchmux.bench.scripts.verify_policies [backend] [model ...]   (default: onnxruntime mlp bert)
import re
import statistics
import sys
import time
import warnings

import torch

import torchmux
from torchmux.bench import zoo

backend = sys.argv[1] if len(sys.argv) > 1 else "onnxruntime"
warnings.simplefilter("ignore")
torch.set_num_threads(1)
for name in sys.argv[2:] or ("mlp", "bert"):
    model, args = zoo.build(name, batch=8)
    model.eval()
    compiled = {}
    with torch.no_grad():
        for policy in ("off", "sparse", "always"):
            torch._dynamo.reset()
            compiled[policy] = torchmux.compile(model, backend=backend, options={"verify": policy})
            for _ in range(300):  # past the sparse schedule's early checks (1, 2, 4, ..., 256)
                compiled[policy](*args)
        times: dict[str, list[float]] = {p: [] for p in compiled}
        for _ in range(11):
            for policy, fn in compiled.items():
                t0 = time.perf_counter()
                for _ in range(200):
                    fn(*args)
                times[policy].append((time.perf_counter() - t0) / 200)
    med = {p: statistics.median(t) for p, t in times.items()}
    print(
        f"{name} on {backend} (1 thread): per call off {med['off'] * 1e6:.0f} us, sparse {med['sparse'] * 1e6:.0f} us "
        f"({med['sparse'] / med['off']:.2f}x), always {med['always'] * 1e6:.0f} us ({med['always'] / med['off']:.2f}x)"
    )


# when a backend that turns wrong is caught, measured: a backend that runs the graph's own code and adds
# 1 to every output from the user's call k on, named with verify="sparse" on the zoo's MLP; the call whose
# check found it (the warning names it), the first call answered right after it (the same call where the
# check answers its call; later where it ran beside the call: verify.py), and how many wrong answers the
# user got (the budget of verify.py included)
class TurnsWrong(torchmux.Backend):
    auto = False
    contract_version = 2

    def __init__(self, name: str, k: int) -> None:
        self.name, self.k = name, k

    def compile(self, request):
        forward, calls = request.ir.gm.forward, [0]

        def run(*a):
            calls[0] += 1  # the trial's two checked calls come first: the user's call N is call N + 2
            return [o + 1 if calls[0] >= self.k + 2 else o for o in forward(*a)]

        return run


model, args = zoo.build("mlp", batch=8)
model.eval()
for k in (3, 5, 20, 100, 1000):
    turns_wrong = TurnsWrong(f"turns_wrong_{k}", k)
    torchmux.register_plugin(turns_wrong)
    torch._dynamo.reset()
    fn = torchmux.compile(model, backend=turns_wrong.name, options={"isolate": "off", "verify": "sparse"})
    wrong, caught, checked = 0, None, None
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        expected = model(*args)
        for call in range(1, 20 * k + 200):
            if not torch.allclose(fn(*args), expected, atol=1e-4):
                wrong += 1
            found = [str(w.message) for w in seen if "demoted" in str(w.message)]
            if found:
                caught = call
                checked = re.search(r"on call (\d+)", found[0])
                break
    at = checked.group(1) if checked else "?"
    print(
        f"wrong from call {k}: caught by the check at call {at}, answered right from call {caught}, {wrong} wrong answers"
    )
