"""The checks torchmux applies to a backend, runnable by the backend's author before any user does.

At a user's first call on a new input signature, and later on the ``verify`` schedule, torchmux runs a
chosen backend's answer through ``autotune.verify.check_call``. This kit runs that same function on
every conformance case the backend claims, plus what the runtime meets only in real programs:

==============  ==========================================================================================
check           passes when
==============  ==========================================================================================
``values``      call 1's outputs match the reference interpreter (core/compare.py's dtype-aware
                tolerances, times the case's ``tol``)
``inputs``      no call writes into an input (a normalized graph mutates none)
``aliasing``    no output shares memory with an input where the reference's output does not
``fresh``       call 2 does not overwrite call 1's outputs (fresh tensors on every call)
``second_call`` a later call, on other values, is right too (the runtime re-checks later calls)
``nonfinite``   right on NaN and ±inf inputs, unless the op is in ``Backend.nonfinite_unsafe`` (then the
                runtime re-checks every such call; the kit reports it as skipped)
``sizes``       ``dynamic_shapes=True`` only: one compile of a symbolic graph is right at two sizes
``model``       through ``torchmux.compile`` (``verify="always"``): a small model with weights and an op
                the backend does not claim, in inference (weights arrive frozen, as ``get_attr``) and,
                if ``"forward"`` is in its phases, a training step; no fallback, right outputs and
                gradients, on two calls
==============  ==========================================================================================

``inputs``, ``aliasing``, ``fresh`` (and ``values`` where the case's ``tol`` is 1) are judged by the
runtime's own ``check_call``, not a copy of it. A check that fails names the case, the dtype and the
reason in the runtime's words.

From pytest, one import::

    from torchmux.testing import conformance_tests

    test_mybackend = conformance_tests(MyBackend())  # or a registered name: conformance_tests("mybackend")

collects one test per claimed op and dtype (``values``, ``inputs``, ``aliasing``, ``fresh``,
``second_call`` together: one compile), one per op for ``nonfinite``, one per op family for ``sizes``
and one for ``model``. Without pytest: :func:`run_kit` returns every :class:`Result`, and
``python -m torchmux.testing.kit BACKEND`` prints the table.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..autotune.placement import build_placement
from ..autotune.verify import check_call
from ..core.backend import Backend
from ..core.compare import mismatch
from ..core.errors import TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.registry import get_registry, register_plugin
from .cases import CASES, Case
from .check import case_ir, check_nonfinite, check_sizes, claims, grown, symbolic_calls

__all__ = ["CHECKS", "Item", "Result", "conformance_tests", "plan", "resolve_backend", "run_kit"]

#: every check the kit runs, in the order it reports them
CHECKS = ("values", "inputs", "aliasing", "fresh", "second_call", "nonfinite", "sizes", "model")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the runtime's reasons (autotune/verify.py ``check_call``), by the check that produced them
_REASONS = {  # the first key found in a reason names its check
    "on its second call": "second_call",
    "wrong answer": "values",
    "changed its input": "inputs",
    "sharing memory": "aliasing",
    "overwrites the outputs": "fresh",
}


@dataclass(frozen=True)
class Result:
    """One check on one case: ``status`` is "pass", "fail" or "skip"; ``detail`` says why."""

    check: str
    case: str
    dtype: str
    status: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.status.upper():4} {self.check:11} {self.case} [{self.dtype}]" + (
            f": {self.detail}" if self.detail else ""
        )


@dataclass(frozen=True)
class Item:
    """One unit of the kit (one pytest test): ``kind`` "op", "nonfinite", "sizes" or "model"."""

    kind: str
    case: Case | None
    dtype: torch.dtype
    device: str = "cpu"

    @property
    def id(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.kind}-{self.case.id if self.case else 'linear_sort_linear'}-{dtype}"

    def run(self, backend: Backend) -> list[Result]:
        return {"op": _run_op, "nonfinite": _run_nonfinite, "sizes": _run_sizes, "model": _run_model}[self.kind](
            backend, self
        )


# ------------------------------------------------------------------------------------------------ the backend
def resolve_backend(spec: Any) -> Backend:
    """A backend from what an author has at hand: the object itself; ``"module.path:Attr"`` (a Backend
    class, instantiated, or instance); ``"module.path"`` of a plugin (its ``torchmux_add_backends()``
    must return one backend, else name it: ``"module.path:name"``); or the name of a registered
    backend. Raises ``ValueError`` saying which of these it tried."""
    if not isinstance(spec, (str, type)) and callable(getattr(spec, "compile", None)):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"{spec!r} is not a backend, a backend name or a module path")
    module_name, _, attr = spec.partition(":")
    registry = get_registry()
    if not attr and spec in registry.names:
        return registry.get(spec)
    if "." in module_name or attr or importlib.util.find_spec(module_name) is not None:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"could not import {module_name!r} ({e}); pass an importable module path") from e
        if attr and hasattr(module, attr):
            value = getattr(module, attr)
            return value() if isinstance(value, type) else value
        hook = getattr(module, "torchmux_add_backends", None)
        if not callable(hook):
            raise ValueError(f"{module_name} has no torchmux_add_backends() and no attribute {attr!r}")
        backends = list(hook() or [])
        chosen = [b for b in backends if not attr or b.name == attr]
        if len(chosen) != 1:
            names = ", ".join(b.name for b in backends) or "none"
            raise ValueError(f"{module_name}'s torchmux_add_backends() returns {names}; name one: {module_name}:NAME")
        return chosen[0]
    return registry.get(spec)  # an unknown name: UnknownBackendError lists the known ones


def _registered(backend: Backend) -> str:
    """The backend's name, registering it first if this process does not know it (``model`` needs it)."""
    registry = get_registry()
    if backend.name not in registry.names:
        register_plugin(backend)
    elif registry.get(backend.name) is not backend:
        known = registry.get(backend.name)
        if type(known) is not type(backend):
            raise ValueError(f"another backend is registered as {backend.name!r} ({known!r}); rename one")
    return backend.name


# ------------------------------------------------------------------------------------------------ the plan
def plan(
    backend: Backend,
    *,
    device: str = "cpu",
    checks: Iterable[str] = ("op", "nonfinite", "sizes", "model"),
    one_per_family: bool = False,
    cases: Sequence[Case] = CASES,
) -> list[Item]:
    """The items the kit runs on ``backend``: every case whose op it claims, in every floating dtype it
    lists (``one_per_family``: the first case of each op family, in its first dtype only)."""
    kinds = set(checks)
    items: list[Item] = []
    families: set[str] = set()
    for case in cases:
        if one_per_family and case.family in families:
            continue
        dtypes = [d for d in FLOAT_DTYPES if d in backend.dtypes] if case.floats else [torch.float32]
        claimed = [d for d in (dtypes[:1] if one_per_family else dtypes) if _claims_case(backend, case, d, device)]
        if not claimed:
            continue
        families.add(case.family)
        if "op" in kinds:
            items += [Item("op", case, d, device) for d in claimed]
        if "nonfinite" in kinds and case.floats and claimed[0] == dtypes[0]:
            items.append(Item("nonfinite", case, claimed[0], device))
    if "sizes" in kinds and getattr(backend, "dynamic_shapes", False):
        seen: set[str] = set()
        for case in cases:
            if case.family not in seen and _claims_case(backend, case, torch.float32, device):
                seen.add(case.family)
                items.append(Item("sizes", case, torch.float32, device))
    if "model" in kinds and torch.float32 in backend.dtypes:
        items.append(Item("model", None, torch.float32, device))
    return items


def _claims_case(backend: Backend, case: Case, dtype: torch.dtype, device: str) -> bool:
    try:
        return claims(backend, _case(case, dtype, device)[0], case.op)
    except Exception:  # noqa: BLE001 -- an op torch itself lacks in this dtype on this device
        return False


@functools.lru_cache(maxsize=1024)
def _case(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[GraphIR, list[torch.Tensor]]:
    """A case's graph and inputs, traced once per process (a check runs on copies of the inputs)."""
    inputs = [t.to(device) for t in case.inputs(dtype, seed)]
    return case_ir(case.fn, inputs, case.id), inputs


# ------------------------------------------------------------------------------------------------ op checks
def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _run_op(backend: Backend, item: Item) -> list[Result]:
    case, dtype = item.case, item.dtype
    assert case is not None
    ir, inputs = _case(case, dtype, item.device)
    order = ("values", "inputs", "aliasing", "fresh", "second_call")

    def fail(check: str, why: str) -> list[Result]:
        """The checks before ``check`` passed, ``check`` failed, the ones after it were not reached."""
        at = order.index(check)
        return [
            Result(c, case.op, _name(dtype), "pass")
            if i < at
            else Result(c, case.op, _name(dtype), "fail", why)
            if i == at
            else Result(c, case.op, _name(dtype), "skip", f"not reached: {check} failed")
            for i, c in enumerate(order)
        ]

    try:
        placement = build_placement(ir, backend, inputs, mode=None, options={})
    except NotImplementedError as e:
        if not str(e).startswith(("claims none", "claims no region")):
            return fail("values", f"compile raised NotImplementedError: {_line(e)}")
        # the op is claimed but the case's graph gives it no region (a view beside an unclaimed op)
        unplaced = f"the case's graph puts nothing on this backend ({_line(e)}); a model that does is checked"
        return [Result(c, case.op, _name(dtype), "skip", unplaced) for c in order]
    except Exception as e:  # noqa: BLE001 -- a compile error is a finding
        return fail("values", f"compile raised {type(e).__name__}: {_line(e)}")
    fn = placement.fn
    try:
        reference = ir.run_reference(*[a.clone() for a in inputs])
        first = list(fn(*[a.clone() for a in inputs]))
        wrong = mismatch(first, reference, scale=case.tol)
        if wrong:
            return fail("values", f"wrong answer: {wrong}")
        # the runtime's own check (calls 1 and 2); a case with a wider tolerance compares with the
        # backend's own first answer, checked above: the check then judges the rest, not the rounding
        _, why = check_call(ir, fn, inputs, twice=True, reference=None if case.tol == 1 else first)
    except Exception as e:  # noqa: BLE001 -- a crash is a finding
        return fail("values", f"crashed: {type(e).__name__}: {_line(e)}")
    if why:
        return fail(next((c for k, c in _REASONS.items() if k in why), "values"), why)
    later = [t.to(item.device) for t in case.inputs(dtype, seed=1)]
    try:
        again = list(fn(*later))
        later_wrong = mismatch(again, ir.run_reference(*later), scale=case.tol)
    except Exception as e:  # noqa: BLE001
        later_wrong = f"crashed: {type(e).__name__}: {_line(e)}"
    if later_wrong:
        return fail("second_call", later_wrong)
    return [Result(c, case.op, _name(dtype), "pass") for c in order]


def _run_nonfinite(backend: Backend, item: Item) -> list[Result]:
    case = item.case
    assert case is not None
    if case.op in getattr(backend, "nonfinite_unsafe", ()):
        why = "listed in nonfinite_unsafe: the runtime re-checks every call with NaN/±inf inputs"
        return [Result("nonfinite", case.op, _name(item.dtype), "skip", why)]
    try:
        wrong = check_nonfinite(backend, case, item.dtype, item.device)
    except Exception as e:  # noqa: BLE001
        wrong = f"crashed: {type(e).__name__}: {_line(e)}"
    if wrong:
        wrong += "; re-run the probe (it lists such ops under nonfinite_unsafe) or fix the op"
    return [Result("nonfinite", case.op, _name(item.dtype), "fail" if wrong else "pass", wrong or "")]


def _run_sizes(backend: Backend, item: Item) -> list[Result]:
    case = item.case
    assert case is not None
    first = [t.to(item.device) for t in case.inputs(torch.float32)]
    second = grown(first)
    try:
        case.fn(*second)
        ir, calls = symbolic_calls(case.fn, [first, second], f"{case.id}-symbolic")
    except Exception:  # noqa: BLE001 -- the program fixes its size, or Dynamo specializes it
        return [Result("sizes", case.op, "float32", "skip", "the case has no symbolic graph at two sizes")]
    if not claims(backend, ir, case.op):
        return [Result("sizes", case.op, "float32", "skip", "not claimed in its symbolic graph")]
    try:
        wrong = check_sizes(backend, ir, calls, case.tol)
    except Exception as e:  # noqa: BLE001
        wrong = f"crashed: {type(e).__name__}: {_line(e)}"
    return [Result("sizes", case.op, "float32", "fail" if wrong else "pass", wrong or "")]


# ------------------------------------------------------------------------------------------------ model check
class _Model(torch.nn.Module):
    """Weights (two Linear layers, a buffer) around an op few backends claim (sort): regions and frozen weights."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(16, 16)
        self.outer = torch.nn.Linear(16, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.inner(x)) * self.scale
        y = torch.sort(y, dim=-1).values
        return torch.tanh(self.outer(y)) + 1


def _run_model(backend: Backend, item: Item) -> list[Result]:
    import torchmux  # the public API, as a user calls it

    name = _registered(backend)
    torch.manual_seed(0)
    model = _Model().to(item.device)
    xs = [torch.randn(8, 16, device=item.device) for _ in range(2)]
    options = {"isolate": "off", "verify": "always"}
    results = []
    phases = [("inference", True)] + ([("training", False)] if "forward" in getattr(backend, "phases", ()) else [])
    for phase, no_grad in phases:
        torch._dynamo.reset()
        compiled = torchmux.compile(model, backend=name, options=options)
        wrong = ""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TorchmuxFallbackWarning)
            try:
                for x in xs:
                    if no_grad:
                        with torch.no_grad():
                            wrong = wrong or (mismatch([compiled(x)], [model(x)]) or "")
                    else:
                        model.zero_grad()
                        model(x).square().sum().backward()
                        expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
                        model.zero_grad()
                        out = compiled(x)
                        out.square().sum().backward()
                        grads = [p.grad for p in model.parameters()]
                        wrong = wrong or (mismatch([out, *grads], [model(x), *expected], scale=5) or "")
            except Exception as e:  # noqa: BLE001
                wrong = f"raised {type(e).__name__}: {_line(e)}"
        fallbacks = [str(w.message) for w in caught if issubclass(w.category, TorchmuxFallbackWarning)]
        unclaimed = [f for f in fallbacks if "claims none of the graph's ops" in f or "claims no region" in f]
        problems = [f for f in fallbacks if f not in unclaimed]
        graphs = 1 if no_grad else 2  # inference: one graph; a training step: a forward and a backward
        case = f"linear_sort_linear ({phase})"
        if wrong or problems:
            results.append(Result("model", case, "float32", "fail", wrong or "; ".join(problems)))
        elif len(unclaimed) >= graphs:
            results.append(Result("model", case, "float32", "skip", unclaimed[0]))
        else:  # a graph it claims nothing of runs on eager: not a fault
            results.append(Result("model", case, "float32", "pass", "; ".join(unclaimed)))
    torch._dynamo.reset()
    return results


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


# ------------------------------------------------------------------------------------------------ entry points
def run_kit(backend: Any, **plan_options: Any) -> list[Result]:
    """Every result of the kit on ``backend`` (see :func:`resolve_backend` for what it accepts)."""
    b = resolve_backend(backend)
    return [r for item in plan(b, **plan_options) for r in item.run(b)]


def summary(results: Sequence[Result]) -> str:
    """One line per check: how many passed, failed and were skipped."""
    lines = []
    for check in CHECKS:
        mine = [r for r in results if r.check == check]
        if mine:
            counts = {s: sum(r.status == s for r in mine) for s in ("pass", "fail", "skip")}
            lines.append(f"{check:11} {counts['pass']:4} pass {counts['fail']:4} fail {counts['skip']:4} skip")
    return "\n".join(lines)


def conformance_tests(
    backend: Any,
    *,
    device: str = "cpu",
    checks: Iterable[str] = ("op", "nonfinite", "sizes", "model"),
    one_per_family: bool = False,
    marks: dict[str, Sequence[Any]] | None = None,
) -> Callable[..., None]:
    """A pytest test function, parametrized over :func:`plan`: assign it to a ``test_*`` name.

    ``marks`` adds pytest marks per item kind (``{"nonfinite": [pytest.mark.slow]}``). A backend that is
    not available here (``availability()`` says no) gives one skipped test that says why."""
    import pytest

    b = resolve_backend(backend)
    try:
        avail = b.availability()
        reason = "" if avail.ok else avail.reason
    except Exception as e:  # noqa: BLE001 -- the runtime counts it unavailable too
        reason = f"its availability check raised {type(e).__name__}: {e}"
    if not reason and not b.supports_device(device):
        reason = f"{b.name} does not run on {device} here (its devices: {', '.join(b.devices)})"
    if not reason and device == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA device here"
    if reason:
        params = [pytest.param(None, id=f"{b.name}-unavailable", marks=pytest.mark.skip(reason=reason))]
    else:
        params = [
            pytest.param(item, id=f"{b.name}-{item.id}", marks=list((marks or {}).get(item.kind, ())))
            for item in plan(b, device=device, checks=checks, one_per_family=one_per_family)
        ]

    @pytest.mark.parametrize("torchmux_item", params)
    def test_conformance(torchmux_item: Item) -> None:
        results = torchmux_item.run(b)
        failed = [str(r) for r in results if r.status == "fail"]
        if failed:
            pytest.fail(f"{b.name}: " + "\n".join(failed), pytrace=False)
        if results and all(r.status == "skip" for r in results):
            pytest.skip("; ".join(r.detail for r in results))

    return test_conformance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchmux.testing.kit", description=__doc__.splitlines()[0])
    parser.add_argument("backend", help="a registered name, a plugin module path, or module.path:Attr")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one-per-family", action="store_true", help="one case per op family, first dtype only")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every result, not only failures")
    args = parser.parse_args(argv)
    results = run_kit(args.backend, device=args.device, one_per_family=args.one_per_family)
    for r in results:
        if args.verbose or r.status == "fail":
            print(r)
    print(summary(results))
    return 1 if any(r.status == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
