"""Print the ops a backend passes, as a Python frozenset ready to paste into its ``ops``.

    python tests/conformance/probe.py onnxruntime [--dtype float32 --dtype float16]

The backend is probed with ``ops=None`` (claiming everything), so the output is what it really runs.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from cases import CASES  # noqa: E402

from torchmux.core.conformance import case_ir, check  # noqa: E402
from torchmux.core.registry import get_registry  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend")
    parser.add_argument("--dtype", action="append", default=None)
    args = parser.parse_args()
    backend = get_registry().require(args.backend)
    backend.ops = None  # probe everything
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32"])]
    passed, failed = [], []
    for case in CASES:
        ok = True
        for dtype in dtypes if case.floats else [torch.float32]:
            inputs = case.inputs(dtype)
            try:
                ir = case_ir(case.fn, inputs, case.id)
                err = check(backend, ir, inputs, case.tol)
            except Exception as e:
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if err:
                ok = False
                failed.append(f"{case.op} [{dtype}]: {err[:200]}")
        if ok:
            passed.append(case.op)
    for f in failed:
        print("# FAIL", f, file=sys.stderr)
    print(f"# {len(passed)} of {len(CASES)} ops pass on {args.backend}")
    print("frozenset({\n" + "".join(f'    "{op}",\n' for op in passed) + "})")


if __name__ == "__main__":
    main()
