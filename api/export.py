"""``torchmux.export`` and ``torchmux.load``: compile once, ship one file, call it with no Dynamo.

``compile()`` keeps TorchDynamo in every call (its guards, the bytecode that reads each weight through
its module path); a deployed model should not pay that. ``export`` is the second way in:

1. **Capture** with ``torch.export`` (``frontends/export.py``: the mend pass retries a refused program;
   a program that still breaks is an error listing each break), normalized into the same
   :class:`GraphIR` as ``compile()``'s graphs and frozen (``autotune/freeze.py``).
2. **Place** with the same autotuner: every candidate backend (one when named) is compiled on the frozen
   graph with the program beside it (``CompileRequest.program``: ONNX Runtime exports the program with
   torch's ONNX exporter, Inductor builds an AOTInductor package), checked against the reference
   interpreter on copies of the example inputs, and timed in interleaved rounds (``autotune/tuner.py``
   ``measure``/``choose``). With dynamic shapes the candidates are also checked at the largest size the
   declared ranges allow (up to :data:`CHECK_SIZE_CAP` per dimension).
3. **Save** (``ExportedModel.save``): the package (``core/package.py``) holds the ``ExportedProgram``,
   the chosen backend's artifact in its native form (``Backend.save``), and ``plan.json``: the inputs'
   specs and ranges, the pytree specs, and every candidate's measurement, best first.
4. **Load** (``torchmux.load``): the chosen artifact is opened by its backend (``Backend.load``); where
   that backend is missing, fails to load, or its native code is not signed by a key this user trusts
   (or was built by another torch or for another machine), the next candidate is taken: a stored
   artifact, else the backend rebuilt from the stored program (a backend that cannot save, such as
   TVM), else eager on the program itself. One :class:`TorchmuxFallbackWarning` says what and why.
5. **Call** (:class:`LoadedModel`): each input's type, dtype, device, rank and every dimension (a
   static size, or a declared symbol within its range and equal wherever the symbol recurs) is checked,
   then the artifact runs on the flat inputs. No Dynamo frame, no guard.

``plan.json`` fields: ``inputs`` (one entry per flat input: ``dtype``, ``device``, ``shape`` with an int
or a symbol name per dimension), ``symbols`` (name -> ``[min, max]``, ``max`` None for unbounded),
``in_spec``/``out_spec`` (``torch.utils._pytree.treespec_dumps``), ``candidates`` (backend, version,
ok, median ms, compile s, reason, artifact folder or None), ``chosen``, ``device``, ``threads``,
``graph`` (name, op count, fingerprint), ``capture`` (strict, mended).
"""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..autotune.freeze import freeze
from ..autotune.tuner import Measurement, choose, measure
from ..core import package as pkg
from ..core.backend import Backend, CompileRequest, LoadRequest, SavedGraph
from ..core.compare import mismatch
from ..core.config import resolve
from ..core.errors import BadArgumentError, TorchmuxError, TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.package import PackageError
from ..core.registry import get_registry
from ..core.version import __version__
from ..frontends.export import Captured, capture

__all__ = ["ExportedModel", "LoadedModel", "export", "load"]

#: with dynamic shapes, candidates are also checked at the largest declared size, capped at this
CHECK_SIZE_CAP = 64
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class PackageInputError(TorchmuxError, ValueError):
    """A call of a loaded package with inputs it was not exported for; the message names the input."""


# ------------------------------------------------------------------------------------------ export
def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: Any = "auto",
    dynamic_shapes: Any = None,
    strict: bool = False,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> ExportedModel:
    """Capture ``model`` whole with ``torch.export``, place it on the fastest correct backend, and return
    an :class:`ExportedModel` (``.save(path)`` writes the package; it is also callable).

    ``args``, ``kwargs``, ``dynamic_shapes`` and ``strict`` are ``torch.export.export``'s. ``backend``:
    ``"auto"`` (measure every available backend), a name, or a list of names. ``options``: as
    ``torchmux.compile``'s (per-backend ``"onnxruntime.intra_op_num_threads"``; ``mend``). Inference
    only: a model in training mode is refused (use ``torchmux.compile`` to train).
    """
    config = resolve(backend, mode, options)
    captured = capture(
        model,
        args,
        kwargs,
        dynamic_shapes=dynamic_shapes,
        strict=strict,
        mend=bool(config.get("mend")),
        breaks=lambda: _breaks(model, args, dict(kwargs or {})),
    )
    weights = iter(captured.weights)
    frozen = freeze(captured.ir, [next(weights) if k != "input" else None for k in captured.ir.input_kinds])
    flat = _flat_inputs(captured.program, args, kwargs or {})
    device = next((a.device.type for a in flat), "cpu")
    candidates = [b for b in config.backends if b.supports_device(device) and _worth_trying(b, device, config)]
    if not any(b.name == "eager" for b in candidates):  # the program itself always runs: the last resort
        candidates.append(get_registry().require("eager"))
    results = measure(
        frozen,
        candidates,
        flat,
        mode=config.mode,
        options=config.options_for,
        timed=config.auto and len(candidates) > 1,
        deadline=_deadline(config),
        program=captured.program,
    )
    results = _check_range(frozen, captured, results, flat)
    named = None if config.auto else config.backends[0].name
    chosen = _pick(results, named)
    if named is not None and chosen.backend != named:
        failed = next(m for m in results if m.backend == named)
        warnings.warn(
            f"torchmux.export: backend {named!r} failed on this program ({failed.reason}); the package runs "
            f"{chosen.backend!r} instead",
            TorchmuxFallbackWarning,
            stacklevel=2,
        )
    by_name = {b.name: b for b in candidates}
    saved: dict[str, SavedGraph] = {}
    backend_obj = by_name[chosen.backend]
    if chosen.placement is not None:
        request = CompileRequest(
            frozen, flat, config.mode, config.options_for(chosen.backend), program=captured.program
        )
        try:
            artifact = backend_obj.save(chosen.placement.fn, request) if chosen.placement.regions == 1 else None
        except Exception as e:  # a backend that cannot save is rebuilt at load: never a failed export
            warnings.warn(
                f"torchmux.export: {chosen.backend}.save failed ({type(e).__name__}: {e}); the package rebuilds "
                "it from the program at load",
                TorchmuxFallbackWarning,
                stacklevel=2,
            )
            artifact = None
        if artifact is not None:
            saved[chosen.backend] = artifact
    plan = _plan(captured, frozen, flat, results, chosen, by_name, saved, device, config.options_for)
    fn = chosen.placement.fn if chosen.placement is not None else pkg.program_runner(captured.program)
    return ExportedModel(captured, plan, saved, fn)


def _breaks(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """One line per break ``torchmux.explain`` finds, with the user's file:line: the breaks left after
    the mend pass, or where it leaves none (export refused what Dynamo's graphs take), those without it."""
    from .explain import explain

    lines: list[str] = []
    try:
        for mend in (True, False):
            report = explain(model, *args, mend=mend, **kwargs)
            found = list(report.break_reasons) + list(report.not_captured)
            lines = [f"  break: {b}" for b in found]
            if lines:
                return lines if mend else lines + ["  (the mend pass removes these breaks for Dynamo; not for export)"]
    except Exception as e:  # explain itself failed: the reasons above are still the answer
        return [f"  (torchmux.explain could not list the breaks: {type(e).__name__}: {str(e)[:200]})"]
    return ["  (torchmux.explain finds no graph break: Dynamo captures the program in one graph, export refuses it)"]


def _deadline(config: Any) -> float:
    """Seconds a candidate may take to compile and answer: the option or ``TORCHMUX_TRIAL_DEADLINE`` when
    given, else the tuning deadline (an export builds whole programs ahead of time: AOTInductor compiles
    a library of the whole model, tens of seconds on two cores, past ``compile()``'s first-call deadline)."""
    import os

    from ..core import settings

    if config.own.get("trial_deadline") or os.environ.get(settings.TRIAL_DEADLINE.name):
        return float(config.trial_deadline)
    return float(settings.TUNING_TRIAL_DEADLINE_SECONDS)


def _worth_trying(backend: Backend, device: str, config: Any) -> bool:
    """A backend that is not competitive untuned here (TVM on the CPU) is measured only when named or
    under max-autotune, as under compile()."""
    tuned = config.mode in ("max-autotune", "max-autotune-no-cudagraphs")
    return not config.auto or tuned or device not in getattr(backend, "needs_tuning", ())


def _flat_inputs(program: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list:
    flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
    return [a for a in flat if isinstance(a, torch.Tensor)]


def _pick(results: Sequence[Measurement], named: str | None) -> Measurement:
    ok = [m for m in results if m.ok]
    if named is not None:
        mine = next((m for m in ok if m.backend == named), None)
        if mine is not None:
            return mine
        return next(m for m in ok if m.backend == "eager")
    best = choose(ok) if len(ok) > 1 else (ok[0] if ok else None)
    if best is None:
        raise TorchmuxError("no backend, eager included, ran the exported program correctly: " + _reasons(results))
    return best


def _reasons(results: Sequence[Measurement]) -> str:
    return "; ".join(m.summary for m in results)


def _check_range(
    ir: GraphIR, captured: Captured, results: list[Measurement], flat: Sequence[torch.Tensor]
) -> list[Measurement]:
    """With dynamic shapes, each correct candidate also answers right at the largest declared size
    (capped): an artifact must cover the range the package promises, not only the example's sizes."""
    sizes = _largest_sizes(captured.program, flat)
    if sizes is None:
        return results
    big = [torch.randn(s, dtype=a.dtype, device=a.device) if a.is_floating_point() else _like(a, s) for a, s in sizes]
    ref = ir.run_reference(*big)
    for m in results:
        if not m.ok or m.placement is None:
            continue
        try:
            wrong = mismatch(m.placement.fn(*[b.clone() for b in big]), ref)
        except Exception as e:
            wrong = f"crashed: {type(e).__name__}: {str(e)[:200]}"
        if wrong:
            m.ok, m.seconds, m.reason = False, math.inf, f"at the largest declared sizes: {wrong}"
    return results


def _like(a: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Integer inputs (token ids) at a new shape: values drawn from the example's own range."""
    lo, hi = (int(a.min()), int(a.max()) + 1) if a.numel() else (0, 1)
    return torch.randint(lo, max(hi, lo + 1), tuple(shape), dtype=a.dtype, device=a.device)


def _largest_sizes(
    program: torch.export.ExportedProgram, flat: Sequence[torch.Tensor]
) -> list[tuple[torch.Tensor, list[int]]] | None:
    specs = _input_specs(program)
    symbols = _symbol_ranges(program)
    if not symbols:
        return None
    top = {s: min(hi if hi is not None else CHECK_SIZE_CAP, CHECK_SIZE_CAP) for s, (lo, hi) in symbols.items()}
    top = {s: max(v, symbols[s][0]) for s, v in top.items()}
    out = []
    for a, spec in zip(flat, specs):
        out.append((a, [d if isinstance(d, int) else top.get(d, a.shape[i]) for i, d in enumerate(spec["shape"])]))
    return out


def _input_specs(program: torch.export.ExportedProgram) -> list[dict[str, Any]]:
    """One entry per flat user input: dtype, device, and per dimension an int or a symbol's name."""
    user = set(program.graph_signature.user_inputs)
    specs = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        shape: list[int | str] = []
        for d in val.shape:
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                shape.append(int(expr) if getattr(expr, "is_number", False) else str(expr))
            else:
                shape.append(int(d))
        specs.append({"dtype": str(val.dtype).removeprefix("torch."), "device": val.device.type, "shape": shape})
    return specs


def _symbol_ranges(program: torch.export.ExportedProgram) -> dict[str, tuple[int, int | None]]:
    out: dict[str, tuple[int, int | None]] = {}
    for sym, vr in program.range_constraints.items():
        lo = int(vr.lower) if vr.lower.is_finite else 0
        hi = int(vr.upper) if vr.upper.is_finite else None
        out[str(sym)] = (lo, hi)
    return out


def _plan(
    captured: Captured,
    frozen: GraphIR,
    flat: Sequence[torch.Tensor],
    results: Sequence[Measurement],
    chosen: Measurement,
    by_name: Mapping[str, Backend],
    saved: Mapping[str, SavedGraph],
    device: str,
    options_for: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    program = captured.program
    ranked = sorted(results, key=lambda m: (m is not chosen, not m.ok, m.seconds if m.seconds == m.seconds else 0.0))
    return {
        "inputs": _input_specs(program),
        "symbols": {k: list(v) for k, v in _symbol_ranges(program).items()},
        "in_spec": pytree.treespec_dumps(program.call_spec.in_spec),
        "out_spec": pytree.treespec_dumps(program.call_spec.out_spec),
        "chosen": chosen.backend,
        "device": device,
        "threads": torch.get_num_threads(),
        "graph": {"name": frozen.name, "ops": len(frozen.op_nodes), "fingerprint": captured.ir.fingerprint()},
        "capture": {"strict": captured.strict, "mended": captured.mended},
        "candidates": [
            {
                "backend": m.backend,
                "version": by_name[m.backend].version if m.backend in by_name else "-",
                "ok": m.ok,
                "ms": None if not m.ok or m.seconds != m.seconds else round(m.seconds * 1e3, 4),
                "compile_s": round(m.compile_seconds, 3),
                "reason": m.reason,
                "artifact": f"artifacts/{m.backend}/" if m.backend in saved else None,
                "native": bool(saved[m.backend].native) if m.backend in saved else False,
                "options": _jsonable(options_for(m.backend)),
            }
            for m in ranked
        ],
    }


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _spec(text: str) -> pytree.TreeSpec:
    """A stored pytree spec; a container type of a library (a Hugging Face ``ModelOutput``) is known only
    once that library registered it: the error says which module to import (none is imported from a file)."""
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError as e:
        found = [w for w in str(e).split() if w.count(".") >= 2 and w[0].isalpha()]
        module = found[0].rsplit(".", 1)[0] if found else "the library that defines it"
        raise PackageError(
            f"the package's inputs or outputs hold a type this process does not know yet ({e}); import {module} "
            "before torchmux.load (the package names types, it never imports code)"
        ) from e


class _Call:
    """The per-call path of a package, shared by :class:`ExportedModel` and :class:`LoadedModel`: check
    each input against the plan, run the flat inputs, rebuild the output's structure."""

    _fn: Callable[..., Sequence[torch.Tensor]]

    def _setup_call(self, plan: Mapping[str, Any]) -> None:
        self.plan = plan
        self._in_spec, self._out_spec = _spec(plan["in_spec"]), _spec(plan["out_spec"])
        self._n = len(plan["inputs"])
        # every input positional, each a tensor: the call's args are the flat inputs themselves
        self._positional = self._in_spec == pytree.tree_structure(((0,) * self._n, {}))
        self._single = self._out_spec == pytree.tree_structure(0)
        self._symbols = {k: (v[0], v[1]) for k, v in plan["symbols"].items()}
        self._checks = [
            (i, _DTYPES[s["dtype"]], s["device"], len(s["shape"]), tuple(s["shape"]))
            for i, s in enumerate(plan["inputs"])
        ]

    def _flat(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        if self._positional and not kwargs:
            if len(args) != self._n:
                raise PackageInputError(
                    f"this package takes {self._n} input{'s' if self._n != 1 else ''} ({self._describe()}), got {len(args)}"
                )
            return args
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self._in_spec:
            raise PackageInputError(
                f"the call's arguments are structured as {spec}, the package was exported for {self._in_spec}; "
                f"pass {self._describe()}"
            )
        return leaves

    def _describe(self) -> str:
        return ", ".join(f"{s['dtype']}{s['shape']} on {s['device']}" for s in self.plan["inputs"])

    def _check(self, flat: Sequence[Any]) -> None:
        seen: dict[str, int] = {}
        grad = torch.is_grad_enabled()
        for i, dtype, device, rank, shape in self._checks:
            a = flat[i]
            if type(a) is not torch.Tensor and not isinstance(a, torch.Tensor):
                raise PackageInputError(f"input {i} must be a tensor ({dtype}), got {type(a).__name__}")
            if a.dtype != dtype or a.device.type != device or a.dim() != rank:
                raise PackageInputError(
                    f"input {i} must be {str(dtype).removeprefix('torch.')} with {rank} dimensions on {device} "
                    f"(shape {list(shape)}), got {str(a.dtype).removeprefix('torch.')}{list(a.shape)} on {a.device.type}"
                )
            if grad and a.requires_grad:
                raise PackageInputError(
                    f"input {i} requires grad: a package runs inference only; call it under torch.no_grad(), "
                    "or train with torchmux.compile"
                )
            for d, want in enumerate(shape):
                got = a.shape[d]
                if type(want) is int:
                    if got != want:
                        raise PackageInputError(
                            f"input {i} dimension {d} must be {want} (it was exported static), got {got}; "
                            "declare it in dynamic_shapes to vary it"
                        )
                    continue
                if want in self._symbols:
                    lo, hi = self._symbols[want]
                    if got < lo or (hi is not None and got > hi):
                        raise PackageInputError(
                            f"input {i} dimension {d} ({want}) must be in [{lo}, {'inf' if hi is None else hi}] "
                            f"as declared in dynamic_shapes, got {got}"
                        )
                    if seen.setdefault(want, got) != got:
                        raise PackageInputError(
                            f"input {i} dimension {d} is {want}, which another input has as {seen[want]}; got {got}"
                        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = self._flat(args, kwargs)
        self._check(flat)
        out = self._fn(*flat)
        if self._single:
            return out[0]
        return pytree.tree_unflatten(list(out), self._out_spec)

    def run_flat(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """The flat inputs in, the flat outputs out (checked the same way): no output structure is rebuilt.
        A Hugging Face ``ModelOutput`` costs ~100-180 us to construct on this CPU, as much as tiny BERT's
        whole ONNX Runtime call at batch 1 spends outside its kernels; a server that wants tensors skips it."""
        self._check(inputs)
        return list(self._fn(*inputs))


class ExportedModel(_Call):
    """What :func:`export` returns: callable as the package will be, and ``save(path)`` writes it."""

    def __init__(
        self, captured: Captured, plan: dict[str, Any], saved: Mapping[str, SavedGraph], fn: Callable[..., Any]
    ) -> None:
        self.captured, self.saved, self._fn = captured, dict(saved), fn
        self._setup_call(plan)

    @property
    def program(self) -> torch.export.ExportedProgram:
        return self.captured.program

    @property
    def backend(self) -> str:
        return str(self.plan["chosen"])

    def save(self, path: str | Path) -> Path:
        """Write the package (one file; ``core/package.py`` says what is in it) and return its path."""
        buf = io.BytesIO()
        torch.export.save(self.captured.program, buf)
        members: dict[str, bytes] = {pkg.PROGRAM: buf.getvalue(), pkg.PLAN: json.dumps(self.plan, indent=1).encode()}
        native = set()
        for name, artifact in self.saved.items():
            folder = f"artifacts/{name}/"
            members[folder + "meta.json"] = json.dumps(_jsonable(dict(artifact.meta))).encode()
            for file, data in artifact.files.items():
                members[folder + file] = data
                if artifact.native:
                    native.add(folder + file)
        registry = get_registry()
        versions = {c["backend"]: c["version"] for c in self.plan["candidates"]}
        info = {
            "machine": pkg.machine_kind(self.plan["device"]),
            "backends": versions,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plugins": {n: registry.package_of(n) for n in versions if n in registry.names},
        }
        return pkg.write_package(path, members, native=native, info=info)


# -------------------------------------------------------------------------------------------- load
def load(path: str | Path, *, backend: str | None = None, options: Mapping[str, Any] | None = None) -> LoadedModel:
    """Open a package written by ``torchmux.export(...).save(path)`` and return a callable
    :class:`LoadedModel`. ``backend`` names a candidate to run instead of the stored choice (it is
    rebuilt from the program when the package holds no artifact of it)."""
    reader = pkg.PackageReader(path)
    return LoadedModel(reader, backend=backend, options=dict(options or {}))


class LoadedModel(_Call):
    """A loaded package: call it as the exported model; ``.backend`` says what runs, ``.notes`` why."""

    def __init__(self, reader: pkg.PackageReader, *, backend: str | None, options: dict[str, Any]) -> None:
        self.reader = reader
        self.manifest = reader.manifest
        plan = reader.json(pkg.PLAN)
        self._setup_call(plan)
        self._options = options
        self._program: torch.export.ExportedProgram | None = None
        self.notes: list[str] = []
        order = [c["backend"] for c in plan["candidates"] if c["ok"]]
        if backend is not None:
            order = [backend] + [b for b in order if b != backend]
        if "eager" not in order:
            order.append("eager")
        self._order = order
        self.backend, self._fn = self._open(order)
        theirs, ours = self.manifest.get("machine") or {}, pkg.machine_kind(self.plan["device"])
        moved = [k for k in ("processor", "device_name") if theirs.get(k) != ours.get(k)]
        if moved and not self.notes:
            self.notes.append(
                "it was tuned on another machine ("
                + ", ".join(f"{theirs.get(k)} there, {ours.get(k)} here" for k in moved)
                + "): the stored choice may not be the fastest here; export it again on this machine to measure"
            )
        if self.notes:
            runs = f"runs {self.backend!r}" + ("" if self.backend == order[0] else f", not {order[0]!r}")
            warnings.warn(
                f"torchmux.load({reader.path}) {runs}: " + "; ".join(self.notes),
                TorchmuxFallbackWarning,
                stacklevel=3,
            )

    # the stored program, read once when something needs it (eager, a rebuild, a weight swap)
    def program(self) -> torch.export.ExportedProgram:
        if self._program is None:
            self._program = torch.export.load(io.BytesIO(self.reader.read(pkg.PROGRAM)))
        return self._program

    def _candidate(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.plan["candidates"] if c["backend"] == name), None)

    def _open(self, order: Sequence[str]) -> tuple[str, Callable[..., Any]]:
        registry = get_registry()
        for name in order:
            if name not in registry.names:
                self.notes.append(f"{name} is not installed here")
                continue
            b = registry.get(name)
            avail = b.availability()
            if not avail.ok or not b.supports_device(self.plan["device"]):
                self.notes.append(f"{name} cannot run here ({avail.reason or 'not on ' + self.plan['device']})")
                continue
            entry = self._candidate(name) or {}
            folder = entry.get("artifact")
            try:
                if folder:
                    why = self._untrusted(folder, entry)
                    if why is None:
                        return name, b.load(self._request(b, folder))
                    self.notes.append(f"{name}'s stored artifact not used ({why}): rebuilt from the program")
                elif name != "eager" and name == self.plan["chosen"]:
                    self.notes.append(f"{name} cannot save its compiled form: rebuilt from the program")
                elif name != "eager":
                    continue  # a candidate with nothing stored: the next stored one, then eager, comes first
                if name == "eager":
                    return name, pkg.program_runner(self.program())
                return name, self._rebuild(b)
            except Exception as e:
                self.notes.append(f"{name} failed to load: {type(e).__name__}: {str(e)[:200]}")
        raise TorchmuxError(f"no backend can run the package {self.reader.path}: " + "; ".join(self.notes))

    def _untrusted(self, folder: str, entry: Mapping[str, Any]) -> str | None:
        """Why a stored artifact must not be loaded here (None: it may)."""
        if not entry.get("native"):
            return None
        for member in self.reader.names(folder):
            if member.endswith("meta.json"):
                continue
            ok, why = self.reader.trusted(member)
            if not ok:
                return why
        built, here = self.manifest.get("torch"), torch.__version__
        if built != here:
            return f"native code built for torch {built}, this is {here}"
        theirs, ours = self.manifest.get("machine", {}), pkg.machine_kind(self.plan["device"])
        if theirs.get("arch") != ours["arch"] or theirs.get("os") != ours["os"]:
            return f"native code built for {theirs.get('os')}/{theirs.get('arch')}, this is {ours['os']}/{ours['arch']}"
        return None

    def _request(self, b: Backend, folder: str) -> LoadRequest:
        files = {m[len(folder) :]: self.reader.read(m) for m in self.reader.names(folder) if m != folder + "meta.json"}
        meta = self.reader.json(folder + "meta.json") if folder + "meta.json" in self.reader.names(folder) else {}
        entry = self._candidate(b.name) or {}
        saved = SavedGraph(files, meta, native=bool(entry.get("native")))
        opts = {**(entry.get("options") or {}), **self._options.get(b.name, {})}
        return LoadRequest(saved, self.plan["device"], torch.get_num_threads(), opts, self.program)

    def _rebuild(self, b: Backend, program: torch.export.ExportedProgram | None = None) -> Callable[..., Any]:
        """Compile ``b`` again from the stored program (normalized and frozen as at export), checked
        against the reference interpreter on inputs made from the plan's specs."""
        from ..frontends.export import normalize

        program = program if program is not None else self.program()
        ir, weights = normalize(program)
        it = iter(weights)
        frozen = freeze(ir, [next(it) if k != "input" else None for k in ir.input_kinds])
        args = self.example_inputs()
        entry = self._candidate(b.name) or {}
        request = CompileRequest(frozen, args, None, dict(entry.get("options") or {}), program=program)
        fn = b.compile(request)
        wrong = mismatch(fn(*[a.clone() for a in args]), frozen.run_reference(*[a.clone() for a in args]))
        if wrong:
            raise RuntimeError(f"rebuilt {b.name} answers wrong: {wrong}")
        return fn

    def example_inputs(self, seed: int = 0) -> list[torch.Tensor]:
        """Inputs of the plan's specs (each symbol at its smallest size above 1 in range): random floats,
        integers in [0, 2)."""
        g = torch.Generator().manual_seed(seed)
        sizes = {s: max(lo, min(2, hi if hi is not None else 2)) for s, (lo, hi) in self._symbols.items()}
        out = []
        for s in self.plan["inputs"]:
            shape = [d if isinstance(d, int) else sizes.get(d, 2) for d in s["shape"]]
            dtype = _DTYPES[s["dtype"]]
            t = (
                torch.randn(shape, generator=g, dtype=dtype)
                if dtype.is_floating_point
                else torch.randint(0, 2, shape, generator=g).to(dtype)
            )
            out.append(t.to(s["device"]))
        return out

    # ------------------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.program().state_dict)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Serve new weights without exporting again: the keys, shapes and dtypes must be the program's
        (an error names the first that is not, and the old weights keep serving); the backend that
        runs is rebuilt with them and checked against eager on the new weights, else eager runs them."""
        program = self.program()
        current = program.state_dict
        missing = sorted(set(current) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(current))
        if unexpected or (strict and missing):
            raise BadArgumentError(
                f"load_state_dict: keys do not match the exported program (missing: {missing[:5] or 'none'}, "
                f"unexpected: {unexpected[:5] or 'none'}); the package keeps serving its current weights"
            )
        for k, v in state_dict.items():
            old = current[k]
            if not isinstance(v, torch.Tensor) or v.shape != old.shape or v.dtype != old.dtype:
                got = f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise BadArgumentError(
                    f"load_state_dict: {k} must be {old.dtype}{list(old.shape)}, got {got}; the package keeps "
                    "serving its current weights"
                )
        fresh = torch.export.load(io.BytesIO(self.reader.read(pkg.PROGRAM)))
        for k, v in state_dict.items():
            target = fresh.state_dict[k]
            fresh.state_dict[k] = (
                torch.nn.Parameter(v.detach().clone(), requires_grad=False)
                if isinstance(target, torch.nn.Parameter)
                else v.detach().clone()
            )
        registry = get_registry()
        if self.backend == "eager":
            fn: Callable[..., Any] = pkg.program_runner(fresh)
        else:
            try:
                fn = self._rebuild(registry.get(self.backend), fresh)
            except Exception as e:
                warnings.warn(
                    f"torchmux: {self.backend} could not be rebuilt with the new weights ({type(e).__name__}: "
                    f"{str(e)[:200]}); eager runs them",
                    TorchmuxFallbackWarning,
                    stacklevel=2,
                )
                self.backend, fn = "eager", pkg.program_runner(fresh)
        self._program, self._fn = fresh, fn


def inspect_package(path: str | Path) -> str:
    """What ``torchmux package inspect`` prints: members and sizes, the plan, versions, the machine."""
    reader = pkg.PackageReader(path)
    m, plan = reader.manifest, reader.json(pkg.PLAN)
    lines = [
        f"{reader.path}: torchmux package (format {m['format_version']}), {reader.path.stat().st_size / 1e6:.2f} MB",
        f"  built with torchmux {m.get('torchmux')} (this is {__version__}), torch {m.get('torch')}, "
        f"python {m.get('python')}, {m.get('created', '')}",
        f"  tuned on: {m.get('machine', {}).get('processor', '?')} ({m.get('machine', {}).get('arch', '?')}, "
        f"{m.get('machine', {}).get('os', '?')}), device {plan['device']}, {plan['threads']} thread(s)",
        f"  graph: {plan['graph']['name']}, {plan['graph']['ops']} ops, fingerprint {plan['graph']['fingerprint'][:16]}; "
        f"capture: {'strict' if plan['capture']['strict'] else 'non-strict'} torch.export"
        + (", after the mend pass" if plan["capture"]["mended"] else ""),
        "  inputs:",
    ]
    for i, s in enumerate(plan["inputs"]):
        lines.append(f"    {i}: {s['dtype']}{s['shape']} on {s['device']}")
    for sym, (lo, hi) in plan["symbols"].items():
        lines.append(f"    {sym} in [{lo}, {'inf' if hi is None else hi}]")
    lines.append(f"  chosen: {plan['chosen']}")
    lines.append("  candidates (best first):")
    for c in plan["candidates"]:
        what = f"{c['ms']:.3f} ms" if c["ms"] is not None else ("correct, not timed" if c["ok"] else "failed")
        art = f", artifact {c['artifact']}" if c["artifact"] else ""
        reason = f" ({c['reason']})" if c["reason"] else ""
        lines.append(
            f"    {c['backend']} {c['version']}: {what}, compiled in {c['compile_s']:.1f} s{art}"
            + (" [native, signed]" if c["native"] else "")
            + reason
        )
    lines.append("  members:")
    for name, entry in sorted(m["members"].items()):
        signed = " signed (" + m.get("key", "?") + " key)" if name in (m.get("signatures") or {}) else ""
        lines.append(f"    {name}: {entry['size'] / 1e6:.2f} MB, sha256 {entry['sha256'][:16]}{signed}")
    return "\n".join(lines)
