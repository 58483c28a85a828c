"""Run every conformance case on one backend and report (or write) the ops it passes, per dtype.

    python -m torchmux.testing.probe onnxruntime --dtype float32 --dtype float16
    python -m torchmux.testing.probe my_package.torchmux_plugin --write my_package/claims.json
    python -m torchmux.testing.probe my_package.torchmux_plugin:MyBackend --write my_package/claims.json

BACKEND is a registered name, the module of a plugin (its ``torchmux_add_backends()``; name one
backend with ``module:name`` if it returns several) or ``module:Attr`` (a Backend class or instance):
the module path works before the plugin is installed or has a claims file
(:func:`torchmux.extend.load_claims` of a missing file claims nothing, with a warning, so the module
imports). From Python, :func:`probe` takes the backend object itself.

The backend is probed claiming everything (``claims`` and ``ops`` set to None, on a copy: the object
passed in keeps its claims), so the result is what it really runs; a dtype outside its ``dtypes`` is
reported and skipped. ``--write`` saves ``{"float32": [...], "float16": [...], "command": "..."}``,
the file :func:`torchmux.extend.load_claims` reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ..core.artifacts import NONFINITE_KEY
from .cases import CASES
from .check import case_ir, check, check_nonfinite
from .kit import resolve_backend


def probe(backend: Any, dtypes: list[torch.dtype], nonfinite: bool = True) -> tuple[dict[str, list[str]], list[str]]:
    """``({dtype name: [ops passed], "nonfinite_unsafe": [ops]}, [failure lines])`` for ``backend``: an
    object, a registered name or a module path (:func:`torchmux.testing.kit.resolve_backend`).

    Every op that passes is run again with NaN and ±inf in its inputs; one that then differs from eager
    is listed under ``"nonfinite_unsafe"``: still claimed, but the checking policy (autotune/verify.py)
    re-checks a graph holding it on every call whose inputs are not all finite.
    """
    backend = copy.copy(resolve_backend(backend))
    avail = backend.availability()
    if not avail.ok:
        raise RuntimeError(f"backend {backend.name!r} cannot run here: {avail.reason}")
    backend.claims, backend.ops = None, None  # probe everything
    passed: dict[str, list[str]] = {str(d).removeprefix("torch."): [] for d in dtypes}
    failed: list[str] = []
    unsafe: list[str] = []
    computes = [d for d in dtypes if d in backend.dtypes]
    for d in dtypes:
        if d not in computes:
            listed = ", ".join(str(x).removeprefix("torch.") for x in backend.dtypes)
            failed.append(f"all ops [{d}]: not probed: {d} is not in the backend's dtypes ({listed})")
    for case in CASES:
        for dtype in computes:
            inputs = case.inputs(dtype if case.floats else torch.float32)
            try:
                err = check(backend, case_ir(case.fn, inputs, case.id), inputs, case.tol)
            except Exception as e:
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if err:
                failed.append(f"{case.op} [{dtype}]: {err[:200]}")
                continue
            passed[str(dtype).removeprefix("torch.")].append(case.op)
            if case.floats and nonfinite:
                try:
                    err = check_nonfinite(backend, case, dtype)
                except Exception as e:
                    err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                if err and case.op not in unsafe:
                    unsafe.append(case.op)
                    failed.append(f"{case.op} [{dtype}, NaN/inf inputs]: {err[:200]}")
    if nonfinite:
        passed[NONFINITE_KEY] = unsafe
    return passed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchmux.testing.probe", description=__doc__.splitlines()[0])
    parser.add_argument("backend", help="a registered name, a plugin module (my_package.plugin) or module:Attr")
    parser.add_argument(
        "--dtype", action="append", default=None, help="float32 (default), float16, bfloat16; repeatable"
    )
    parser.add_argument("--write", type=Path, default=None, help="write the claims file here")
    args = parser.parse_args(argv)
    dtypes = [getattr(torch, d) for d in (args.dtype or ["float32"])]
    passed, failed = probe(args.backend, dtypes)
    for line in failed:
        print("# FAIL", line, file=sys.stderr)
    for dtype, ops in passed.items():
        if dtype == NONFINITE_KEY:
            print(f"# {len(ops)} ops differ from eager on NaN/inf inputs: {', '.join(ops)}")
            continue
        print(f"# {dtype}: {len(ops)} of {len(CASES)} ops pass on {args.backend}")
    if args.write:
        command = " ".join(["python -m torchmux.testing.probe", *(argv if argv is not None else sys.argv[1:])])
        args.write.write_text(
            json.dumps({"command": command, **{k: sorted(v) for k, v in passed.items()}}, indent=1) + "\n"
        )
        print(f"wrote {args.write}")
    else:
        print(json.dumps(passed, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
