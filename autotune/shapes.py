"""Symbolic graphs: one compile per backend, one tuning per size range, not one per shape.

With ``dynamic=None`` (torch.compile's default) Dynamo captures a graph static on its first shape; when
a dimension changes it captures it again with that dimension symbolic (``s0``), and the same graph
then serves every size Dynamo's guards admit. This module is what the runner (runner.py) does with
such a graph.

**Who runs a symbolic graph.** A backend whose ``dynamic_shapes`` is true compiles the symbolic graph
once and that one artifact serves every size (eager, Inductor, ONNX Runtime with dynamic axes, TVM
with symbolic Relax shapes, the Triton code generator with sizes as kernel arguments). A backend that needs static shapes (``dynamic_shapes = False``) is
*specialized*: :func:`specialize` re-traces the graph at the call's concrete sizes and the backend
compiles that static graph. Specializations are bounded: at most :data:`SPECIALIZE_LIMIT` concrete
signatures per graph and backend. Under ``backend="auto"`` static backends do not race on symbolic
graphs: a specialization could serve only its own sizes, and a graph goes symbolic precisely because
its sizes change (the first shape's static graph is raced by every backend). With static backends
named by the user (and no symbolic one), each new signature is specialized up to the limit; past it
the graph runs eagerly with a :class:`TorchmuxFallbackWarning` that says so and what to do. A named
backend with ``dynamic_shapes`` that fails to compile a particular symbolic graph (TVM's importer
refuses some symbolic ops) is specialized the same way, bounded the same way.

**Size ranges and representative sizes (the tuning rule).** A symbolic graph's sizes are grouped in
power-of-two ranges per symbol: a value ``v`` belongs to range ``v.bit_length()``, so 1 | 2-3 | 4-7 |
8-15 | 16-31 ... (:func:`size_range`). The first call whose sizes fall in a range not yet tuned is
that range's representative: the candidates are timed on it (the symbolic ones are already compiled,
so this costs timing, not compiles) and the winner runs every later size of the range. So a batch
swept over 1..50 is tuned at most 7 times (the ranges of 1, 2, 4, 8, 16, 32) and compiled once per
symbolic backend. Each range's winner is remembered on disk (decisions.py, keyed on the range) like
any other decision, and different ranges may keep different winners (Inductor for small batches,
ONNX Runtime for large ones, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.ir import GraphIR

#: most concrete signatures a static-only backend is specialized for, per symbolic graph
SPECIALIZE_LIMIT = 4


def symbol_values(ir: GraphIR, args: Sequence[Any]) -> dict[str, int]:
    """The value of each of the graph's symbols in this call, read from the inputs' sizes."""
    values: dict[str, int] = {}
    for node, arg in zip(ir.placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            expr = val.node.expr
            if getattr(expr, "is_Symbol", False):
                values[str(expr)] = int(arg)
        elif isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            for d, a in zip(val.shape, arg.shape):
                if isinstance(d, torch.SymInt) and getattr(d.node.expr, "is_Symbol", False):
                    values[str(d.node.expr)] = int(a)
    return values


def size_range(values: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """The power-of-two range of each symbol's value: ``v`` is in range ``v.bit_length()``
    (1 | 2-3 | 4-7 | 8-15 ...); the key a symbolic graph's decisions are made and remembered under."""
    return tuple(sorted((name, max(v, 0).bit_length()) for name, v in values.items()))


def describe_range(key: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{name} in [{1 << (k - 1) if k else 0}, {(1 << k) - 1}]" for name, k in key) or "static"


def takes_symbolic(backend: Any) -> bool:
    """Whether ``backend`` compiles a symbolic graph once for every size (its ``dynamic_shapes``)."""
    return bool(getattr(backend, "dynamic_shapes", False))


def specialize(ir: GraphIR, args: Sequence[Any]) -> tuple[GraphIR, list[int]]:
    """The graph at the concrete sizes of ``args``: re-traced with real inputs, so every size is a number.

    The integer inputs (the symbols' values) become constants of this specialization and leave the
    signature: returns the static graph and the positions of ``args`` it takes (the tensors).
    """
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(ir.gm, tracing_mode="fake")(*args)
    keep = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    for node, arg in zip([n for n in gm.graph.nodes if n.op == "placeholder"], args):
        if not isinstance(arg, torch.Tensor):
            node.replace_all_uses_with(arg)
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    keyed = [a for a, kind in zip(args, ir.input_kinds) if kind == "input"]
    static = GraphIR(gm, [ir.input_kinds[i] for i in keep], name=f"{ir.name}@{signature_text(keyed)}", phase=ir.phase)
    return static.lint(), keep


def signature_text(args: Sequence[Any]) -> str:
    return ",".join(
        "x".join(map(str, a.shape)) if isinstance(a, torch.Tensor) else str(a)
        for a in args
        if not (isinstance(a, torch.Tensor) and a.dim() == 0)
    )


class SymbolicChooser:
    """The runner's decisions for one symbolic graph: a winner per size range, each symbolic backend
    compiled once, static backends specialized up to :data:`SPECIALIZE_LIMIT` signatures."""

    def __init__(self, ir: GraphIR, config: Any) -> None:
        self.ir = ir
        self.config = config
        self.compiled: dict[str, Any] = {}  # backend name -> Placement of the symbolic graph
        self.failed: dict[str, str] = {}  # backend name -> why it cannot run this graph
        self.hung: dict[str, str] = {}  # backend name -> its trial ran past the deadline: never tried again
        self.specialized: dict[str, int] = {}  # backend name -> how many signatures it was specialized for
        self.ranges: dict[tuple, Any] = {}  # size range -> (Decision, fallback fn for other sizes of the range)
        self.compiles: dict[str, int] = {}  # backend name -> compiles made for this graph (for reports and tests)
        self.last_results: list[Any] = []  # the last tuning's measurements (failures name their reason)

    # ------------------------------------------------------------------------------------------
    def choose(self, sig: tuple, args: Sequence[Any], candidates: Sequence[Any]) -> tuple[Any, Any]:
        """(Decision, fn) for this call: the range's winner, tuned now if the range is new."""
        key = size_range(symbol_values(self.ir, args))
        if key not in self.ranges:
            self.ranges[key] = self._tune(key, args, candidates)
        decision, for_range, own_sig = self.ranges[key]
        if own_sig is not None and own_sig != sig:  # a specialization serves only its own sizes
            if for_range is not None:
                return decision, for_range
            if (key, sig) not in self.ranges:  # no symbolic backend ran it: specialize again (bounded)
                self.ranges[(key, sig)] = self._tune(key, args, candidates)
            decision, _, _ = self.ranges[(key, sig)]
        return decision, decision.chosen.placement.fn if decision is not None else None

    # ------------------------------------------------------------------------------------------
    def _symbolic_placement(self, backend: Any, args: Sequence[Any]) -> Any:
        from .placement import build_placement

        if backend.name in self.failed:
            raise RuntimeError(self.failed[backend.name])
        if backend.name not in self.compiled:
            try:
                self.compiled[backend.name] = build_placement(
                    self.ir, backend, args, mode=self.config.mode, options=self.config.options_for(backend.name)
                )
                self.compiles[backend.name] = self.compiles.get(backend.name, 0) + 1
            except Exception as e:
                from .tuner import short_error

                self.failed[backend.name] = f"compile failed: {short_error(e)}"
                raise
        return self.compiled[backend.name]

    def _static_placement(self, backend: Any, args: Sequence[Any]) -> Any:
        from .placement import build_placement

        if self.specialized.get(backend.name, 0) >= SPECIALIZE_LIMIT:
            raise RuntimeError(
                f"already specialized for {SPECIALIZE_LIMIT} signatures (its limit; it needs static shapes)"
            )
        self.specialized[backend.name] = self.specialized.get(backend.name, 0) + 1
        static, keep = specialize(self.ir, args)
        self.compiles[backend.name] = self.compiles.get(backend.name, 0) + 1
        placement = build_placement(
            static,
            backend,
            [args[i] for i in keep],
            mode=self.config.mode,
            options=self.config.options_for(backend.name),
        )
        inner = placement.fn
        placement.fn = lambda *a: inner(*[a[i] for i in keep])  # the integer inputs are constants of it
        return placement

    def _tune(self, key: tuple, args: Sequence[Any], candidates: Sequence[Any]) -> tuple[Any, Any, Any]:
        import math
        import time
        from functools import partial

        from ..core.compare import mismatch
        from . import decisions as cache
        from .tuner import Decision, Measurement, TrialTimeout, choose, short_error, time_rounds, within_deadline
        from .verify import clone_inputs

        config = self.config
        user_args, args = args, clone_inputs(args, self.ir.input_kinds)  # trials never touch the user's tensors
        deadline = config.trial_deadline
        if any(takes_symbolic(b) for b in candidates) and config.auto:
            candidates = [b for b in candidates if takes_symbolic(b)]  # see the module docstring
        remembered = (
            cache.load(cache.decision_key(self.ir, ("range", key), candidates, config.mode))
            if config.auto and len(candidates) > 1
            else None
        )
        if remembered and any(b.name == remembered.get("backend") and takes_symbolic(b) for b in candidates):
            candidates = [b for b in candidates if b.name == remembered["backend"]]  # compile only the winner
        reference = self.ir.run_reference(*args)
        results: list[Measurement] = []
        live = []
        own: dict[str, bool] = {}
        for b in candidates:
            if b.name in self.hung:
                results.append(Measurement(b.name, math.inf, False, self.hung[b.name]))
                continue
            symbolic = takes_symbolic(b) and b.name not in self.failed
            try:  # compile and first call under the trial deadline, as in tuner.measure
                build = self._symbolic_placement if symbolic else self._static_placement
                placement = within_deadline(partial(build, b, args), deadline)
            except TrialTimeout:
                self.hung[b.name] = f"timed out after {deadline:g} s (compile)"
                results.append(Measurement(b.name, math.inf, False, self.hung[b.name]))
                continue
            except Exception as e:
                reason = (self.failed.get(b.name) if symbolic else None) or short_error(e)
                if symbolic and not config.auto:  # it cannot take this symbolic graph: specialize it instead
                    try:
                        placement = self._static_placement(b, args)
                        symbolic = False
                    except Exception as e2:
                        results.append(
                            Measurement(b.name, math.inf, False, f"{reason}; specialized: {short_error(e2)}")
                        )
                        continue
                else:
                    results.append(Measurement(b.name, math.inf, False, reason))
                    continue
            m = Measurement(b.name, math.inf, False, "", placement.compile_seconds, placement)
            results.append(m)
            try:
                t0 = time.perf_counter()
                out = within_deadline(partial(placement.fn, *clone_inputs(args, self.ir.input_kinds)), deadline)
                first = time.perf_counter() - t0
            except TrialTimeout:
                self.hung[b.name] = m.reason = f"timed out after {deadline:g} s (first call)"
                continue
            except Exception as e:
                m.reason = f"crashed: {short_error(e)}"
                continue
            wrong = mismatch(out, reference)
            if wrong:
                m.reason = f"wrong answer: {wrong}"
                continue
            m.ok, m.seconds, own[b.name] = True, first, not symbolic
            live.append((m, placement.fn))
        if config.auto and len(live) > 1:
            time_rounds(live, args, float(config.get("autotune_budget")) / 2, 15)
        best = choose(results)
        self.last_results = results
        from ..core.registry import get_registry

        for m in results:
            get_registry().notify(
                "torchmux_candidate_measured",
                ir=self.ir,
                backend=m.backend,
                seconds=m.seconds,
                ok=m.ok,
                reason=m.reason,
                chosen=m is best,
            )
        if best is None:  # nothing ran it right: the graph's own ops, eagerly (the runner warns)
            return None, None, None
        best_symbolic = choose([m for m in results if m.ok and not own[m.backend]])
        decision = Decision(best, results)
        if config.auto and len(candidates) > 1:
            cache.store(
                cache.decision_key(self.ir, ("range", key), candidates, config.mode),
                {
                    "backend": best.backend,
                    "range": describe_range(key),
                    "measurements": [
                        {"backend": m.backend, "seconds": m.seconds if m.ok else None, "reason": m.reason}
                        for m in results
                    ],
                },
            )
        own_sig = None
        if own.get(best.backend):
            from .runner import _signature

            own_sig = _signature(user_args, [i for i, k in enumerate(self.ir.input_kinds) if k == "input"])
        return decision, best_symbolic and best_symbolic.placement.fn, own_sig  # type: ignore[union-attr]
