"""Run every conformance case on one backend and report (or write) the ops it passes, per dtype.

    python -m torchmux.testing.probe onnxruntime --dtype float32 --dtype float16
    python -m torchmux.testing.probe mybackend --write mybackend/claims.json

The backend is probed claiming everything (``claims`` and ``ops`` set to None), so the result is what
it really runs. ``--write`` saves ``{"float32": [...], "float16": [...], "command": "..."}``, the file
:func:`torchmux.extend.load_claims` reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..core.registry import get_registry
from .cases import CASES
from .check import case_ir, check


def probe(name: str, dtypes: list[torch.dtype]) -> tuple[dict[str, list[str]], list[str]]:
    """``({dtype name: [ops passed]}, [failure lines])`` for backend ``name``."""
    backend = get_registry().require(name)
    backend.claims, backend.ops = None, None  # probe everything
    passed: dict[str, list[str]] = {str(d).removeprefix("torch."): [] for d in dtypes}
    failed: list[str] = []
    for case in CASES:
        for dtype in dtypes:
            inputs = case.inputs(dtype if case.floats else torch.float32)
            try:
                err = check(backend, case_ir(case.fn, inputs, case.id), inputs, case.tol)
            except Exception as e:
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if err:
                failed.append(f"{case.op} [{dtype}]: {err[:200]}")
            else:
                passed[str(dtype).removeprefix("torch.")].append(case.op)
    return passed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchmux.testing.probe", description=__doc__.splitlines()[0])
    parser.add_argument("backend")
    parser.add_argument("--dtype", action="append", default=None, help="float32 (default), float16, bfloat16; repeatable")
    parser.add_argument("--write", type=Path, default=None, help="write the claims file here")
    args = parser.parse_args(argv)
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32"])]
    passed, failed = probe(args.backend, dtypes)
    for line in failed:
        print("# FAIL", line, file=sys.stderr)
    for dtype, ops in passed.items():
        print(f"# {dtype}: {len(ops)} of {len(CASES)} ops pass on {args.backend}")
    if args.write:
        command = " ".join(["python -m torchmux.testing.probe", *(argv if argv is not None else sys.argv[1:])])
        args.write.write_text(json.dumps({"command": command, **{k: sorted(v) for k, v in passed.items()}}, indent=1) + "\n")
        print(f"wrote {args.write}")
    else:
        print(json.dumps(passed, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
