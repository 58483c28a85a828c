"""``torchmux.export`` and ``torchmux.load``: compile once, ship one file, call it with no Dynamo.

``compile()`` keeps TorchDynamo in every call (its guards, the bytecode that reads each weight through
its module path); a deployed model should not pay that. ``export`` is the second way in:

1. **Capture** with ``torch.export`` (``frontends/export.py``: the mend pass retries a refused program;
   a program that still breaks is an error listing each break), normalized into the same
   :class:`GraphIR` as ``compile()``'s graphs and frozen (``autotune/freeze.py``).
2. **Place** with the same autotuner: every candidate backend (one when named) is first tried in the trial
   child (``autotune/isolate.py``: built, called, saved and loaded back there; one that crashes or hangs
   is a failed row with its reason), then compiled in this process on the frozen
   graph with the program beside it (``CompileRequest.program``: ONNX Runtime exports the program with
   torch's ONNX exporter, Inductor builds an AOTInductor package) and checked against the reference
   interpreter on copies of the example inputs (``autotune/tuner.py`` ``measure``); with dynamic shapes
   also at the largest size the declared ranges allow (up to :data:`CHECK_SIZE_CAP` per dimension).
   Then each is **measured as it ships** (:func:`_ship`): saved, loaded back as ``torchmux.load`` will
   load it, checked again (also on other values of the example's shapes), and only that loaded form is
   timed, in interleaved rounds
   (:data:`EXPORT_TIMING_SECONDS`; ``time_rounds``/``choose``). What compile() runs and what a package
   runs differ (ONNX Runtime's package session has its own arena and no I/O binding); the choice is
   made on what the package runs. With ``options={"split": N}`` a split placement joins them
   (:func:`_split`): pieces placed by measurement, each built from its own exported program, saved,
   loaded back and wired (``load.Pieces``), checked and timed like the rest. On CUDA with static
   shapes each shipped candidate is also measured replayed as one CUDA graph (:func:`_graphed`,
   ``<backend>+cudagraphs``).
3. **Save** (``ExportedModel.save``): the package (``core/package.py``) holds the ``ExportedProgram``,
   the chosen backend's artifact in its native form (``Backend.save``), and ``plan.json``: the inputs'
   specs and ranges, the pytree specs, and every candidate's measurement, best first.

Steps 4 (**Load**) and 5 (**Call**) are ``api/load.py``'s: it imports only what loading needs.

``plan.json`` fields: ``inputs`` (one entry per flat tensor input: ``dtype``, ``device``, ``shape`` with
an int or a symbol name per dimension), ``constants`` (``[position, value]`` for each flat input that is a
fixed Python value, an int layer index say: ``torch.export`` specialized the program to it, every
backend takes the tensors alone, and each call checks the value), ``symbols`` (name -> ``[min, max]``, ``max`` None for unbounded),
``names`` (symbol -> the user's ``Dim`` name, for messages and ``package inspect``),
``in_spec``/``out_spec`` (``torch.utils._pytree.treespec_dumps``), ``candidates`` (backend, version,
the plugin and distribution that provide it (load imports that one plugin only), ok, median ms,
compile s, reason, artifact folder or None; ``<backend>+cudagraphs``: that backend's artifact, its call
recorded as a CUDA graph at load), ``chosen``, ``device``, ``threads``, ``graph`` (name, op
count, fingerprint), ``capture`` (strict, mended).
"""

from __future__ import annotations

import io
import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..autotune import isolate
from ..autotune.freeze import freeze
from ..autotune.tuner import Measurement, choose, measure, time_rounds
from ..core import package as pkg
from ..core.backend import Backend, CompileRequest, SavedGraph
from ..core.compare import mismatch
from ..core.config import resolve
from ..core.errors import TorchmuxError, TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.package import loaded_back, saved_and_loaded
from ..core.registry import get_registry
from ..frontends.export import Captured, capture
from .load import GRAPHED, SPLIT, LoadedModel, PackageInputError, _Call, base_of, load

__all__ = ["ExportedModel", "LoadedModel", "PackageInputError", "export", "load"]

#: with dynamic shapes, candidates are also checked at the largest declared size, capped at this
CHECK_SIZE_CAP = 64
#: seconds of interleaved timing rounds among the candidates (``options={"autotune_budget": s}`` sets it):
#: a package is measured once and run for long, and the candidates are few; compile()'s default is 0.5
EXPORT_TIMING_SECONDS = 3.0
EXPORT_MAX_ROUNDS = 60


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
    isolate.prestart(config.backends, config.isolation, model)  # the trial child starts while torch.export captures
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
    flat = _flat_inputs(args, kwargs or {})
    device = next((a.device.type for a in flat), "cpu")
    candidates = [b for b in config.backends if b.supports_device(device) and _worth_trying(b, device, config)]
    if not any(b.name == "eager" for b in candidates):  # the program itself always runs: the last resort
        candidates.append(get_registry().require("eager"))
    # a crash or hang in a candidate's build, first calls, save or load back stays in a child (isolate.py)
    signature = tuple((tuple(a.shape), a.dtype, a.device.type) for a in flat)
    safe, unsafe = isolate.screen(
        frozen,
        signature,
        candidates,
        flat,
        mode=config.mode,
        options=config.options_for,
        isolation=config.isolation,
        deadline=_deadline(config),
        program=captured.program,
    )
    results = [Measurement(name, math.inf, False, why) for name, why in unsafe] + measure(
        frozen,
        safe,
        flat,
        mode=config.mode,
        options=config.options_for,
        timed=False,
        deadline=_deadline(config),
        program=captured.program,
    )
    results = _check_range(frozen, captured, results, flat)
    by_name = {b.name: b for b in candidates}
    saved, shipped = _ship(frozen, captured, results, by_name, flat, config, device)
    live = [(m, shipped[m.backend]) for m in results if m.ok and m.backend in shipped]
    if device == "cuda" and config.auto and frozen.is_static:
        live += _graphed(frozen, results, live, shipped, saved, by_name, flat, captured.program, config, device)
    budget = float(config.get("autotune_budget")) if "autotune_budget" in config.own else EXPORT_TIMING_SECONDS
    if config.auto and len(live) > 1:
        for m, _ in live:
            m.seconds = math.inf  # measure() left it untimed (NaN); time_rounds keeps the fastest warm call
        time_rounds(live, flat, budget, EXPORT_MAX_ROUNDS)
        found = _split(frozen, results, by_name, flat, config, device, captured.program)
        if found is not None:
            split, ships = found
            results.append(split)
            if ships is not None:  # the split as it ships, timed again with every whole candidate
                saved[split.backend], shipped[split.backend] = ships
                live.append((split, ships[1]))
                for m, _ in live:
                    m.seconds = math.inf
                time_rounds(live, flat, budget, EXPORT_MAX_ROUNDS)
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
    # the package holds the chosen artifact (a graphed candidate's is its backend's: recorded again at load)
    saved = {k: v for k, v in saved.items() if k == base_of(chosen.backend)}
    names = _dim_names(model, args, kwargs or {}, dynamic_shapes, captured.program)
    plan = _plan(captured, frozen, flat, results, chosen, by_name, saved, device, config.options_for, names)
    return ExportedModel(captured, plan, saved, shipped.get(chosen.backend) or pkg.program_runner(captured.program))


def _ship(
    frozen: GraphIR,
    captured: Captured,
    results: Sequence[Measurement],
    by_name: Mapping[str, Backend],
    flat: Sequence[torch.Tensor],
    config: Any,
    device: str,
) -> tuple[dict[str, SavedGraph], dict[str, Callable[..., Any]]]:
    """Each correct candidate in the form a package ships it: saved (``Backend.save``), loaded back
    (``Backend.load``, as ``torchmux.load`` will in another process) and checked again against the
    reference on copies of the inputs; what is timed and chosen is what the package runs. A candidate
    that cannot save (or whose saved form does not load here) ships as compiled, rebuilt at load; one
    whose loaded form answers wrong or crashes fails, with that reason. Every candidate but eager is
    also checked on other values of the same shapes (:func:`_on_other_values`): a package has no later
    checks of its calls, as ``compile()``'s guard has, so an answer kept from the first call is caught
    here or never."""
    from ..autotune.verify import check_call

    program = captured.program
    saved: dict[str, SavedGraph] = {}
    shipped: dict[str, Callable[..., Any]] = {}
    for m in results:
        if not m.ok or m.placement is None:
            continue
        b, fn = by_name[m.backend], m.placement.fn
        request = CompileRequest(frozen, flat, config.mode, config.options_for(m.backend), program=program)
        try:
            artifact, fn = saved_and_loaded(b, m.placement, request, device)
            if artifact is not None:
                saved[m.backend] = artifact
        except Exception as e:  # a backend that cannot save or load here is rebuilt at load: never a failed export
            warnings.warn(
                f"torchmux.export: {m.backend}'s saved form failed here ({type(e).__name__}: {str(e)[:200]}); a "
                "package that chooses it rebuilds it from the program at load",
                TorchmuxFallbackWarning,
                stacklevel=3,
            )
            fn = m.placement.fn
        wrong = None
        if fn is not m.placement.fn:
            try:
                _, wrong = check_call(frozen, fn, flat, twice=True)
            except Exception as e:
                wrong = f"crashed: {type(e).__name__}: {str(e)[:200]}"
        if m.backend != "eager":  # the program itself
            wrong = wrong or _on_other_values(frozen, fn, flat)
        if wrong:
            shipping = fn is not m.placement.fn
            m.ok, m.seconds, m.reason = False, math.inf, f"its saved and loaded form: {wrong}" if shipping else wrong
            saved.pop(m.backend, None)
            continue
        shipped[m.backend] = fn
    return saved, shipped


def _graphed(
    frozen: GraphIR,
    results: list[Measurement],
    live: Sequence[tuple[Measurement, Callable[..., Any]]],
    shipped: dict[str, Callable[..., Any]],
    saved: Mapping[str, SavedGraph],
    by_name: Mapping[str, Backend],
    flat: Sequence[torch.Tensor],
    program: torch.export.ExportedProgram,
    config: Any,
    device: str,
) -> list[tuple[Measurement, Callable[..., Any]]]:
    """Step 3b, on CUDA with static shapes: each shipped candidate (but eager, and ``cudagraphs``, which is
    eager's call recorded) also as its call recorded once and replayed as one CUDA graph
    (``core/cudagraph.py``), named ``<backend>+cudagraphs`` (:data:`GRAPHED`): an AOTInductor library's
    launches replayed, which no backend offers alone (Inductor's ``reduce-overhead`` does it behind
    Dynamo). What is recorded is the backend's artifact loaded again for it (``LoadRequest.recorded``:
    AOTInductor single-threaded), or the callable it ships where it saves none: a recording that fails
    can leave what it recorded unusable, never a saved candidate it came from. Each is checked like any
    candidate (twice, against the reference) within the trial deadline, the recording thread alone held
    to CUDA's capture rules, and joins the timing rounds; one that cannot be recorded, answers wrong or
    hangs is a failed measurement with the reason. It stores its backend's artifact; ``torchmux.load``
    loads and records it again."""
    from ..autotune.tuner import TrialTimeout, short_error, within_deadline
    from ..autotune.verify import check_call
    from ..core.cudagraph import record

    def recorded(m: Measurement, fn: Callable[..., Any]) -> tuple[Callable[..., Any], str | None]:
        artifact = saved.get(m.backend)
        if artifact is not None:  # a load of its own: a failed recording may leave it unusable
            fn = loaded_back(by_name[m.backend], artifact, program, device, config.options_for(m.backend), True)
        with torch.no_grad():  # a package runs inference: recorded without autograd, whatever the caller's mode
            graphed = record(fn, flat, capture_error_mode="thread_local")
        _, wrong = check_call(frozen, graphed, flat, twice=True)
        # and on other values: work the recording missed (a library computing on a stream of its own, or on
        # the host) replays the recorded call's outputs, right for the inputs it was recorded on only
        return graphed, wrong or _on_other_values(frozen, graphed, flat)

    deadline = _deadline(config)
    added = []
    for m, fn in list(live):
        if m.backend in ("eager", "cudagraphs") or m.backend.startswith(SPLIT) or m.backend not in by_name:
            continue
        g = Measurement(m.backend + GRAPHED, math.inf, False, placement=m.placement)
        t0 = time.perf_counter()
        try:
            graphed, wrong = within_deadline(partial(recorded, m, fn), deadline)
            g.ok, g.reason = not wrong, wrong or ""
        except TrialTimeout:
            g.reason = f"timed out after {deadline:g} s recording it as a CUDA graph"
        except Exception as e:
            g.reason = f"could not be recorded as a CUDA graph: {short_error(e)}"
        if g.ok:
            shipped[g.backend] = graphed
            added.append((g, graphed))
        g.compile_seconds = m.compile_seconds + time.perf_counter() - t0
        results.append(g)
    return added


def _on_other_values(frozen: GraphIR, fn: Callable[..., Any], flat: Sequence[Any]) -> str | None:
    """Why ``fn`` answers wrong on other values of the example's shapes (:func:`_rolled`), or None. The
    checks before ran it twice on the example's own values: a candidate that keeps something of its
    first call (outputs cached by shape, a CUDA graph that recorded no work) answers those right and
    these wrong. Where the program itself refuses the other values (lengths it needs sorted, say),
    nothing is judged."""
    from ..autotune.verify import check_call

    other = _rolled(flat)
    try:
        with torch.no_grad():
            result = frozen.gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in other])
    except Exception:
        return None
    reference = list(result) if isinstance(result, (tuple, list)) else [result]
    try:
        _, wrong = check_call(frozen, fn, other, reference=reference)
    except Exception as e:
        return f"crashed on other input values: {type(e).__name__}: {str(e)[:200]}"
    return f"on other input values: {wrong}" if wrong else None


def _rolled(args: Sequence[Any]) -> list[Any]:
    """Each tensor's values moved one place along its flattened order: other inputs made of the same values
    (token ids stay in the vocabulary, masks stay masks)."""
    return [a.flatten().roll(1).view_as(a) if isinstance(a, torch.Tensor) and a.numel() > 1 else a for a in args]


def _split(
    frozen: GraphIR,
    results: Sequence[Measurement],
    by_name: Mapping[str, Backend],
    flat: Sequence[torch.Tensor],
    config: Any,
    device: str,
    whole: torch.export.ExportedProgram,
) -> tuple[Measurement, tuple[SavedGraph, Callable[..., Any]] | None] | None:
    """Step 2b, ``options={"split": N}`` under auto (static shapes): the program cut into up to N pieces
    and each piece placed by measurement, as ``compile()`` does (``autotune/split.py``). The winners are
    then built the way a package ships them: each piece exported on its own (``torch.export`` of the
    piece's graph), compiled from that program by its backend, saved in its native form, loaded back,
    and the pieces wired in order (:class:`Pieces`); the whole is checked against the program's
    reference and joins the candidates' timing rounds. Returns its measurement and, when it is correct,
    what ships (the artifact, the loaded callable); None: nothing to split (too small, dynamic shapes,
    fewer than two contenders, one backend won every piece). Each piece stores its program (what it is
    rebuilt from, and an eager piece's form) without the weights it shares with the whole program
    (:func:`_shared_weights`): the package holds each weight once."""
    from ..autotune.split import contenders, label, place_segments, split
    from ..autotune.tuner import SCREEN_FACTOR
    from ..autotune.verify import check_call, clone_inputs
    from .load import Pieces

    if config.split_segments < 2 or not config.auto:
        return None
    if not frozen.is_static:
        warnings.warn(
            "torchmux.export: options['split'] is for static shapes; with dynamic_shapes the program is placed "
            "whole (export without dynamic_shapes, one package per shape, to measure a split)",
            TorchmuxFallbackWarning,
            stacklevel=3,
        )
        return None
    pool = [by_name[n] for n in contenders(results, SCREEN_FACTOR) if n in by_name]
    if len(pool) < 2:
        return None
    t0 = time.perf_counter()
    args = clone_inputs(flat, frozen.input_kinds)
    deadline = _deadline(config)
    try:
        placed = place_segments(
            frozen,
            pool,
            args,
            segments=config.split_segments,
            mode=config.mode,
            options=config.options_for,
            time_budget=EXPORT_TIMING_SECONDS,
            deadline=deadline,
        )
    except Exception as e:  # an fx pass on an unusual graph: no split candidate
        return Measurement("split", math.inf, False, f"split failed: {type(e).__name__}: {str(e)[:200]}"), None
    if placed is None:
        return None
    plan = placed[0]
    name = label(plan.backends)
    files: dict[str, bytes] = {}
    entries: list[dict[str, Any]] = []
    fns: list[Callable[..., Any]] = []
    try:
        parent, pieces = split(frozen, plan.cuts, args)
        wiring, outputs = _wiring(parent)
        registry = get_registry()
        for i, (piece, backend) in enumerate(zip(pieces, plan.backends)):
            b = by_name[backend]
            program = torch.export.export(piece.ir.gm, tuple(piece.args), strict=False)
            m = measure(
                piece.ir,
                [b],
                piece.args,
                mode=config.mode,
                options=config.options_for,
                timed=False,
                deadline=deadline,
                program=program,
            )[0]
            if not m.ok or m.placement is None:
                raise RuntimeError(f"piece {i} on {backend}: {m.reason}")
            request = CompileRequest(piece.ir, piece.args, config.mode, config.options_for(backend), program=program)
            artifact, fn = saved_and_loaded(b, m.placement, request, device)
            shared = _shared_weights(program, whole)
            files[f"piece{i}/program.pt2"] = _saved_without(program, shared)
            if artifact is not None:
                files.update({f"piece{i}/{f}": data for f, data in artifact.files.items()})
            entries.append(
                {
                    "backend": backend,
                    "version": b.version,
                    "plugin": registry.plugin_of(backend),
                    "package": registry.package_of(backend),
                    "options": _jsonable(config.options_for(backend)),
                    "ops": len(piece.ir.op_nodes),
                    "saved": artifact is not None,
                    "files": sorted(artifact.files) if artifact is not None else [],
                    "meta": _jsonable(dict(artifact.meta)) if artifact is not None else {},
                    "native": bool(artifact is not None and artifact.native),
                    "inputs": wiring[i],
                    "weights": shared,
                }
            )
            fns.append(fn)
        runner = Pieces(fns, wiring, outputs)
        _, wrong = check_call(frozen, runner, flat, twice=True)
    except Exception as e:
        wrong = f"crashed: {type(e).__name__}: {str(e)[:200]}"
    m = Measurement(name, math.inf, not wrong, f"its saved and loaded form: {wrong}" if wrong else "")
    m.compile_seconds = time.perf_counter() - t0
    if wrong:
        return m, None
    meta = {"pieces": entries, "outputs": outputs, "cuts": list(plan.cuts)}
    return m, (SavedGraph(files, meta, native=any(e["native"] for e in entries)), runner)


def _shared_weights(piece: torch.export.ExportedProgram, whole: torch.export.ExportedProgram) -> dict[str, str]:
    """Which of a piece's weights and constant tensors are the whole program's, by name (piece -> whole):
    the same memory (a piece holds the frozen graph's constants, which are the program's own), else the
    same dtype, shape and values. A weight the freezing made anew (a folded transpose) is the piece's."""

    def plain(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
        tensors = {**program.state_dict, **program.constants}.items()
        return {n: t for n, t in tensors if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.is_cpu}

    def memory(t: torch.Tensor) -> tuple[Any, ...]:
        return (t.data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())

    theirs = plain(whole)
    by_memory: dict[tuple[Any, ...], str] = {}
    by_spec: dict[tuple[Any, ...], list[str]] = {}
    for name, t in theirs.items():
        by_memory.setdefault(memory(t), name)
        by_spec.setdefault((t.dtype, tuple(t.shape)), []).append(name)
    out: dict[str, str] = {}
    for name, t in plain(piece).items():
        found = by_memory.get(memory(t)) or next(
            (w for w in by_spec.get((t.dtype, tuple(t.shape)), ()) if torch.equal(theirs[w], t)), None
        )
        if found is not None:
            out[name] = found
    return out


def _saved_without(program: torch.export.ExportedProgram, names: Mapping[str, str]) -> bytes:
    """``program`` as ``torch.export.save`` writes it, each weight in ``names`` saved empty (the loader puts
    the whole program's tensor back: ``api/load._piece_program``)."""
    saved = {}
    for name in names:
        table = program.state_dict if name in program.state_dict else program.constants
        t = saved[name] = table[name]
        empty = torch.empty(0, dtype=t.dtype)
        table[name] = torch.nn.Parameter(empty, requires_grad=False) if isinstance(t, torch.nn.Parameter) else empty
    try:
        buf = io.BytesIO()
        torch.export.save(program, buf)
        return buf.getvalue()
    finally:
        for name, t in saved.items():
            (program.state_dict if name in program.state_dict else program.constants)[name] = t


def _wiring(parent: torch.fx.GraphModule) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Where each piece of ``autotune/split.py``'s parent graph reads its inputs from and where the
    program's outputs come from, as :class:`Pieces` names them (``[0, k]`` input k, ``[i + 1, k]``
    output k of piece i)."""
    import operator

    ref: dict[torch.fx.Node, list[int]] = {}
    wiring: list[list[list[int]]] = []
    outputs: list[list[int]] = []
    for node in parent.graph.nodes:
        if node.op == "placeholder":
            ref[node] = [0, sum(1 for r in ref.values() if r[0] == 0)]
        elif node.op == "call_module":
            wiring.append([ref[a] for a in node.args])
            ref[node] = [len(wiring), 0]  # a piece of one output returns it in a list of one
        elif node.op == "call_function" and node.target is operator.getitem:
            ref[node] = [ref[node.args[0]][0], int(node.args[1])]
        elif node.op == "output":
            values = node.args[0]
            outputs = [ref[v] for v in (values if isinstance(values, (tuple, list)) else [values])]
        else:
            raise ValueError(f"the split's parent graph holds a {node.op} ({node.target}): not a chain of pieces")
    return wiring, outputs


def _breaks(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """One line per break ``torchmux.explain`` finds, with the user's file:line: the breaks left after
    the mend pass, or where it leaves none (export refused what Dynamo's graphs take), those without it.
    ``explain`` runs the program, so it runs on copies of the model and inputs: a refused export leaves the
    user's model as it was (a first call's initialization not done, a counter not counted)."""
    import itertools

    from ..frontends.mend.verdict import copies
    from .compile import VERDICT_COPY_BYTES
    from .explain import explain

    held = sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))
    if held > VERDICT_COPY_BYTES:
        return ["  (torchmux.explain(model, *args) lists the breaks: it runs the model, too large to copy here)"]
    lines: list[str] = []
    try:
        for mend in (True, False):
            m, a, k = copies(model, args, kwargs)
            report = explain(m, *a, mend=mend, **k)
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


def _flat_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list:
    flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
    return [a for a in flat if isinstance(a, torch.Tensor)]


def _pick(results: Sequence[Measurement], named: str | None) -> Measurement:
    ok = [m for m in results if m.ok]
    if named is not None:
        mine = next((m for m in ok if m.backend == named), None)
        if mine is not None:
            return mine
        ok = [m for m in ok if m.backend == "eager"]
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
    (capped): an artifact must cover the range the package promises, not only the example's sizes. The
    values are drawn from the example's own range (a loss whose inputs are probabilities gets
    probabilities); where the program itself raises on them (an index out of its range), they are not
    inputs it takes, and the check is left to the example's sizes."""
    sizes = _largest_sizes(captured.program, flat)
    if sizes is None or all(list(a.shape) == s for a, s in sizes):  # only unbacked values are symbolic
        return results
    big = [_like(a, s) for a, s in sizes]
    try:
        ref = ir.run_reference(*big)
    except Exception:  # noqa: BLE001 -- the program's own refusal of these values, not a backend's fault
        return results
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
    """An input at a new shape, its values drawn uniformly from the example's own range (token ids stay
    ids, probabilities stay probabilities)."""
    if a.is_complex():
        return torch.randn(tuple(shape), dtype=a.dtype, device=a.device)
    if a.is_floating_point():
        lo, hi = (float(a.min()), float(a.max())) if a.numel() else (0.0, 1.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return torch.randn(tuple(shape), dtype=a.dtype, device=a.device)
        return torch.rand(tuple(shape), dtype=a.dtype, device=a.device) * (hi - lo) + lo
    lo_i, hi_i = (int(a.min()), int(a.max()) + 1) if a.numel() else (0, 1)
    return torch.randint(lo_i, max(hi_i, lo_i + 1), tuple(shape), dtype=a.dtype, device=a.device)


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


def _dim_names(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    dynamic_shapes: Any,
    program: torch.export.ExportedProgram,
) -> dict[str, str]:
    """The user's name for each of the program's size symbols (``{"s70": "seq"}``): each ``Dim`` in
    ``dynamic_shapes`` matched to the symbol at its input's dimension. Messages and ``package inspect``
    say ``seq``; the plan keeps torch's symbols as keys (a derived size is an expression of them).
    Only where every input is a tensor given directly; a symbol two names claim is left unnamed."""
    import inspect

    if not dynamic_shapes:
        return {}
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
        order = list(bound)[: len(args)] + list(kwargs)
        if isinstance(dynamic_shapes, Mapping):
            per_input = [dynamic_shapes.get(k) for k in order]
        else:
            per_input = list(dynamic_shapes) + [None] * (len(order) - len(dynamic_shapes))
        if not all(isinstance(bound[k], torch.Tensor) for k in order):
            return {}
    except (TypeError, ValueError):
        return {}
    names: dict[str, set[str]] = {}
    for spec, dims in zip(_input_specs(program), per_input):
        items = dims.items() if isinstance(dims, Mapping) else enumerate(dims or ())
        for d, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(name, str) and isinstance(d, int) and d < len(spec["shape"]):
                symbol = spec["shape"][d]
                if isinstance(symbol, str):
                    names.setdefault(symbol, set()).add(name)
    return {sym: next(iter(found)) for sym, found in names.items() if len(found) == 1}


def _symbol_ranges(program: torch.export.ExportedProgram) -> dict[str, tuple[int, int | None]]:
    out: dict[str, tuple[int, int | None]] = {}
    for sym, vr in program.range_constraints.items():
        lo, hi = _bound(vr.lower), _bound(vr.upper)
        out[str(sym)] = (lo if lo is not None else 0, hi)
    return out


def _bound(value: Any) -> int | None:
    """A range's end as an int; None for an infinite one (sympy's ``oo``, or torch's own ``int_oo`` of an
    unbacked ``.item()`` value, whose ``is_finite`` does not say so)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


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
    captured_names: Mapping[str, str],
) -> dict[str, Any]:
    program = captured.program
    ranked = sorted(results, key=lambda m: (m is not chosen, not m.ok, m.seconds if m.seconds == m.seconds else 0.0))
    base = {m.backend: base_of(m.backend) for m in ranked}  # a graphed candidate: its backend's entries
    return {
        "inputs": _input_specs(program),
        "constants": [[i, v] for i, v in pkg.constant_inputs(program)],
        "symbols": {k: list(v) for k, v in _symbol_ranges(program).items()},
        "names": captured_names,
        "in_spec": pytree.treespec_dumps(program.call_spec.in_spec),
        "out_spec": pytree.treespec_dumps(program.call_spec.out_spec),
        "chosen": chosen.backend,
        "device": device,
        "threads": torch.get_num_threads(),
        "graph": {"name": frozen.name, "ops": len(frozen.op_nodes), "fingerprint": captured.ir.fingerprint()},
        "capture": {
            "strict": captured.strict,
            "mended": captured.mended,
            "fixed": {name: pkg.tensor_digest(value) for name, value in sorted(captured.fixed.items())},
        },
        "candidates": [
            {
                "backend": m.backend,
                "version": by_name[base[m.backend]].version if base[m.backend] in by_name else "-",
                "plugin": get_registry().plugin_of(base[m.backend]),
                "package": get_registry().package_of(base[m.backend]),
                "ok": m.ok,
                "ms": None if not m.ok or m.seconds != m.seconds else round(m.seconds * 1e3, 4),
                "compile_s": round(m.compile_seconds, 3),
                "reason": m.reason,
                "artifact": f"artifacts/{_folder(base[m.backend])}/" if base[m.backend] in saved else None,
                "unsaved": _unsaved(m, saved),
                "native": bool(saved[base[m.backend]].native) if base[m.backend] in saved else False,
                "options": _jsonable(options_for(base[m.backend])),
            }
            for m in ranked
        ],
    }


def _unsaved(m: Measurement, saved: Mapping[str, SavedGraph]) -> str | None:
    """Why a correct candidate has no compiled form in the package (``torchmux.load`` rebuilds it from the
    program and says this), or None."""
    if not m.ok or base_of(m.backend) in saved or m.backend == "eager" or m.backend.startswith(SPLIT):
        return None
    regions, eager = getattr(m.placement, "regions", 1), getattr(m.placement, "ops_eager", 0)
    if regions != 1:
        return f"its placement is {regions} regions with ops left to eager between them; a package stores one graph"
    if eager:
        return f"its placement leaves {eager} op(s) to eager beside its one region; a package stores one graph"
    return "its backend saves no compiled form"


def _folder(name: str) -> str:
    """A candidate's artifact folder under ``artifacts/``: its name; ``split`` for a split placement."""
    return "split" if name.startswith(SPLIT) else name


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


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
        native: set[str] = set()
        for name, artifact in self.saved.items():
            folder = f"artifacts/{_folder(name)}/"
            members[folder + "meta.json"] = json.dumps(_jsonable(dict(artifact.meta))).encode()
            members.update({folder + file: data for file, data in artifact.files.items()})
            if name.startswith(SPLIT):  # the native pieces' files only
                for i, piece in enumerate(artifact.meta["pieces"]):
                    native.update(f"{folder}piece{i}/{f}" for f in piece["files"] if piece["native"])
            elif artifact.native:
                native.update(folder + file for file in artifact.files)
        registry = get_registry()
        versions = {c["backend"]: c["version"] for c in self.plan["candidates"]}
        info = {
            "machine": pkg.machine_kind(self.plan["device"]),
            "backends": versions,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plugins": {n: registry.package_of(n) for n in versions if n in registry.names},
        }
        return pkg.write_package(path, members, native=native, info=info)
