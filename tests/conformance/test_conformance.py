"""The backend conformance suite: every op a backend claims, on random inputs, against the reference.

Generated over (backend x op case x dtype). A backend is tested on exactly the ops it claims
(``Backend.supports``) and in the floating dtypes it lists (``Backend.dtypes``); an op it does not claim
is not tested on it. Inductor claims every op; compiling 79 graphs with it would take many minutes on
2 cores, so it runs one case per op family (it is PyTorch's own, tested by PyTorch's suite).
Tests that need a GPU are marked ``gpu`` and skip without one.
"""

from __future__ import annotations

import functools

import pytest
import torch

from torchmux.core.registry import get_registry
from torchmux.testing import CASES, CASES_BY_OP, Case, case_ir, check, claims
from torchmux.testing.check import check_nonfinite

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SAMPLED = {"inductor"}  # backends that run one case per family


@functools.cache
def _ir(op: str, dtype: torch.dtype, device: str):
    case = CASES_BY_OP[op]
    inputs = [t.to(device) for t in case.inputs(dtype)]
    return case_ir(case.fn, inputs, case.id), inputs


def _params(device: str) -> list:
    registry = get_registry()
    params = []
    for name in registry.names:
        backend = registry.get(name)
        avail = registry.availability(name)
        marks = [pytest.mark.gpu] if device == "cuda" else []
        if not avail.ok or not backend.supports_device(device) or (device == "cuda" and not torch.cuda.is_available()):
            why = (
                avail.reason
                if not avail.ok
                else f"no {device} here"
                if device == "cuda"
                else f"does not run on {device}"
            )
            params.append(
                pytest.param(name, None, None, id=f"{name}-unavailable", marks=marks + [pytest.mark.skip(reason=why)])
            )
            continue
        seen_families: set[str] = set()
        for case in CASES:
            if name in SAMPLED:
                if case.family in seen_families:
                    continue
                seen_families.add(case.family)
            dtypes = [d for d in FLOAT_DTYPES if d in backend.dtypes] if case.floats else [torch.float32]
            if name in SAMPLED:
                dtypes = dtypes[:1]
            for dtype in dtypes:
                try:
                    ir, _ = _ir(case.op, dtype, device)
                except Exception:  # e.g. an op torch itself lacks in this dtype on this device
                    continue
                if claims(backend, ir, case.op):
                    params.append(pytest.param(name, case, dtype, id=f"{name}-{case.id}-{str(dtype)[6:]}", marks=marks))
    return params


def _run(backend_name: str, case: Case, dtype: torch.dtype, device: str) -> None:
    backend = get_registry().get(backend_name)
    ir, inputs = _ir(case.op, dtype, device)
    err = check(backend, ir, inputs, case.tol)
    assert err is None, f"{backend_name} claims {case.op} but gets it wrong in {dtype}: {err}"


@pytest.mark.parametrize("backend_name,case,dtype", _params("cpu"))
def test_op_cpu(backend_name: str, case: Case, dtype: torch.dtype) -> None:
    _run(backend_name, case, dtype, "cpu")


@pytest.mark.slow  # compiles nothing new (the artifacts are keyed on the graph), but runs every claimed op again
@pytest.mark.parametrize(
    "backend_name,case,dtype",
    [p for p in _params("cpu") if p.values[2] in (torch.float32, None) and (p.values[1] is None or p.values[1].floats)],
)
def test_op_cpu_nonfinite(backend_name: str, case: Case, dtype: torch.dtype) -> None:
    """Claims hold for NaN and ±inf too, except where the claims file says they do not (nonfinite_unsafe)."""
    backend = get_registry().get(backend_name)
    if case.op in backend.nonfinite_unsafe:
        pytest.skip(
            f"{backend_name} lists {case.op} as nonfinite_unsafe: graphs holding it are re-checked on NaN/inf inputs"
        )
    err = check_nonfinite(backend, case, dtype)
    assert err is None, (
        f"{backend_name} claims {case.op} but differs from eager on NaN/inf inputs: {err}; "
        "re-run its probe to list it under nonfinite_unsafe"
    )


@pytest.mark.parametrize("backend_name,case,dtype", _params("cuda"))
def test_op_cuda(backend_name: str, case: Case, dtype: torch.dtype) -> None:
    _run(backend_name, case, dtype, "cuda")


@pytest.mark.parametrize("backend_name", get_registry().names)
def test_claims_come_from_the_suite(backend_name: str) -> None:
    """A backend's claims name only ops the suite has a case for (no guessing)."""
    backend = get_registry().get(backend_name)
    claimed = set().union(*backend.claims.values()) if backend.claims else set(backend.ops or ())
    if backend.claims is None and backend.ops is None:
        pytest.skip(f"{backend_name} claims every op: the suite runs it on every case it can")
    unknown = sorted(claimed - set(CASES_BY_OP))
    assert not unknown, f"{backend_name} claims ops the conformance suite does not test: {unknown}"


def test_suite_covers_at_least_60_ops() -> None:
    assert len(CASES_BY_OP) >= 60
    assert {c.family for c in CASES} >= {"pointwise", "reduction", "matmul", "conv", "norm", "view", "compare"}


# ------------------------------------------------------------------------------ dynamic shapes
def _dynamic_params() -> list:
    """One case per op family (float32), on every available CPU backend with ``dynamic_shapes``
    except Inductor (PyTorch's own; and slow to compile on 2 cores)."""
    registry = get_registry()
    params = []
    for name in registry.names:
        backend = registry.get(name)
        if (
            not getattr(backend, "dynamic_shapes", False)
            or name in SAMPLED
            or not registry.availability(name).ok
            or not backend.supports_device("cpu")
        ):
            continue
        seen: set[str] = set()
        for case in CASES:
            if case.family not in seen:
                seen.add(case.family)
                params.append(pytest.param(name, case, id=f"{name}-{case.id}"))
    return params


@functools.cache
def _symbolic(op: str):
    from torchmux.testing.check import grown, symbolic_calls

    case = CASES_BY_OP[op]
    first = case.inputs(torch.float32)
    second = grown(first)
    try:
        case.fn(*second)
    except (RuntimeError, ValueError, IndexError):
        return None  # the program itself fixes that size (a hard-coded shape): nothing to vary
    try:
        return symbolic_calls(case.fn, [first, second], f"{case.id}-symbolic")
    except (RuntimeError, ValueError, torch._dynamo.exc.TorchDynamoException):
        return None  # Dynamo specializes it (no symbolic graph to test)


@pytest.mark.parametrize("backend_name,case", _dynamic_params())
def test_op_two_sizes_one_compile(backend_name: str, case: Case) -> None:
    """A backend with dynamic_shapes compiles the op's symbolic graph once and answers right at two sizes."""
    from torchmux.testing.check import check_sizes

    captured = _symbolic(case.op)
    if captured is None:
        pytest.skip(f"{case.op}: the case has no symbolic graph at two sizes")
    ir, calls = captured
    backend = get_registry().get(backend_name)
    if not claims(backend, ir, case.op):
        pytest.skip(f"{backend_name} does not claim {case.op} in its symbolic graph")
    err = check_sizes(backend, ir, calls, case.tol)
    assert err is None, f"{backend_name} runs {case.op} at one size but not the other: {err}"
