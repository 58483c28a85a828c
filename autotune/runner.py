"""The callable that stands in for one captured graph: it chooses, on first call, where the graph runs.

Each distinct input signature (shapes, dtypes, devices) gets its own decision. With one named backend
the decision is "that backend, if its first answer is right, else eager"; with several it is the
tuner's (tuner.py). Whatever goes wrong in a backend ends in a :class:`TorchmuxFallbackWarning` and the
eager graph, never in a wrong result or a crash of the user's program.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from ..core import settings
from ..core.config import CompileConfig
from ..core.errors import TorchmuxFallbackWarning
from ..core.ir import GraphIR
from ..core.registry import get_registry
from ..core.userframe import user_location, warn_at
from . import decisions as cache
from . import distributed, isolate, progress, screen, verdicts, verify
from .freeze import MAX_REFREEZES, FrozenCall, can_freeze, freeze
from .guard import Guard
from .placement import build_placement
from .shapes import SymbolicChooser, describe_range, size_range, symbol_values
from .split import Plan, build_split, try_split
from .tuner import Decision, Measurement, TrialTimeout, choose, in_own_thread, measure, within_deadline


def _signature(args: Sequence[Any], keyed: Sequence[int]) -> tuple:
    """What a decision is keyed on: shape, dtype and device of the inputs at ``keyed`` (the user's
    inputs, not parameters or buffers), the value of a non-tensor input (a SymInt's size)."""
    return tuple(
        (a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a) for a in [args[i] for i in keyed]
    )


class GraphRunner:
    """Runs one normalized graph on the backend chosen for its input signature.

    Parameters and buffers are not part of the signature: the graph's fingerprint holds their specs,
    and Dynamo guards them (a parameter of another shape is another graph). Leaving them out keeps
    the per-call cost to the user's few inputs instead of every weight of the model.
    """

    def __init__(self, ir: GraphIR, config: CompileConfig) -> None:
        self.ir = ir
        self.config = config
        self.decisions: dict[tuple, Decision] = {}
        self._fns: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._keyed = [i for i, kind in enumerate(ir.input_kinds) if kind == "input"]
        self._one = self._keyed[0] if len(self._keyed) == 1 else None
        self._freezing = bool(config.get("freeze")) and can_freeze(ir)
        # a symbolic graph is decided per size range, each backend compiled once (shapes.py)
        self._structure: str | None = None
        self._symbolic_eager: Measurement | None = None
        self.symbolic = None if ir.is_static else SymbolicChooser(ir, config, self._symbolic_fallback, self.structure)
        self._where: Any = None  # the user's line that made the first call: fallback warnings point there
        self._refreezes = 0
        self._rebuild: dict[tuple, str] = {}  # signature -> backend to rebuild after a weight change

    def __call__(self, *args: Any) -> list[Any]:
        if self._one is not None and isinstance(a := args[self._one], torch.Tensor):  # the common case, inlined
            sig: tuple = ((a.shape, a.dtype, a.device),)
        else:
            sig = _signature(args, self._keyed)
        fn = self._fns.get(sig)
        if fn is None:
            with self._lock:
                self._where = user_location()
                fn = self._fns.get(sig) or self._decide_in_clean_thread(sig, args)
        return fn(*args)

    def _decide_in_clean_thread(self, sig: tuple, args: Sequence[Any]) -> Any:
        """Backends compile in a fresh thread: the first call may come from inside AOTAutograd's runtime
        (an autograd.Function, dispatch keys excluded), whose thread-local state breaks compilers that
        trace (Inductor runs AOTAutograd itself)."""

        def work() -> Any:
            with torch.no_grad():
                return self._decide(sig, args)

        return in_own_thread(work, f"torchmux-{self.ir.name}")  # its timing runs back in this thread

    @property
    def structure(self) -> str:
        """The graph apart from its sizes (verdicts.py): what its verdicts are carried under."""
        if self._structure is None:
            self._structure = verdicts.structure(self.ir)
        return self._structure

    @property
    def _deadline(self) -> float:
        """Seconds a candidate's compile and first checked calls may take (tuner.within_deadline)."""
        return self.config.trial_deadline

    # ------------------------------------------------------------------------------------------
    def _candidates(self, args: Sequence[Any]) -> list:
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        out = []
        for b in self.config.backends:
            if not b.supports_device(device):
                continue
            out.append(b)  # a symbolic graph: static-only backends are specialized, bounded (shapes.py)
        return out

    def _decide(self, sig: tuple, args: Sequence[Any]) -> Any:
        """Choose for ``sig``; an inference graph is frozen first (freeze.py): the backends see its weights
        as constants, and the callable returned checks them before every call."""
        if self.symbolic is not None:
            return self._decide_symbolic(sig, args)
        if self._freezing:
            fn = self._decide_on(freeze(self.ir, args), sig, [args[i] for i in self._keyed], frozen=True)
            fn = FrozenCall(fn, self.ir, args, on_change=lambda a: self._weights_changed(sig, a))
        else:
            fn = self._decide_on(self.ir, sig, args)
        self._fns[sig] = fn
        return fn

    def _weights_changed(self, sig: tuple, args: Sequence[Any]) -> Any:
        """A frozen weight changed: freeze again and rebuild the backend that won (not measured again);
        after MAX_REFREEZES changes, run unfrozen."""
        with self._lock:
            current = self._fns.get(sig)
            if current is not None and (not isinstance(current, FrozenCall) or current.unchanged(args)):
                return current  # another thread refroze already
            self._refreezes += 1
            if self._refreezes > MAX_REFREEZES:
                self._freezing = False
                self._rebuild.clear()
            else:
                self._rebuild[sig] = self.decisions[sig].backend
            self._fns.pop(sig, None)
            return self._decide_in_clean_thread(sig, args)

    def _decide_on(self, ir: GraphIR, sig: tuple, args: Sequence[Any], frozen: bool = False) -> Any:
        config = self.config
        candidates = self._candidates(args)
        demotions = [
            Measurement(b.name, math.inf, False, f"demoted earlier: {why}")
            for b in candidates
            if (why := verify.demoted(ir, sig, b))
        ]
        candidates = [b for b in candidates if b.name not in {m.backend for m in demotions}]
        # what a backend did on a graph of this structure (this graph at another size: verdicts.py)
        shape = self.structure
        for b in candidates:
            if (v := verdicts.recall(shape, b, config.mode)) is not None and not v.ok:
                demotions.append(
                    Measurement(
                        b.name, math.inf, False, f"failed on this graph at other sizes: {v.reason}", quiet=v.here
                    )
                )
        candidates = [b for b in candidates if b.name not in {m.backend for m in demotions}]
        by_name = {b.name: b for b in candidates}
        registry = get_registry()
        tuned = config.auto and len(candidates) > 1
        key = cache.decision_key(self.ir, sig, candidates, config.mode, config.split_segments, frozen) if tuned else ""
        role = distributed.role() if tuned else None
        rank_key = distributed.key_for(self.ir, sig, config.mode) if role else ""
        if not config.auto and len(config.backends) == 1 and candidates and candidates[0].name == "eager":
            placement = build_placement(ir, candidates[0], args, mode=config.mode, options={})
            decision = Decision(Measurement("eager", math.nan, True, placement=placement), [])
        elif role == "follower":  # rank 0 chose (distributed.py); run its choice, checked
            decision = self._remembered(
                ir, sig, candidates, args, frozen, distributed.receive(rank_key)
            ) or self._rank0_failed(ir, args)
        elif (rebuilt := self._rebuilt(ir, sig, candidates, args)) is not None:
            decision = rebuilt
        elif config.auto and (remembered := self._remembered(ir, sig, candidates, args, frozen)) is not None:
            decision = remembered
        else:
            checked = config.auto or verify.policy_of(config.get("verify")) != "off"
            device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
            left_out = screen.skipped(ir, candidates, device, config.mode) if config.auto else {}
            built = [b for b in candidates if b.name not in left_out]
            # isolate.py: a crash or hang in a candidate new to this graph stays in a child; only what is built
            built, unsafe = isolate.screen(
                ir,
                sig,
                built,
                args,
                mode=config.mode,
                options=config.options_for,
                isolation=config.isolation,
                deadline=self._deadline,
                where=self._where,
                structure=shape,
            )
            demotions += [Measurement(name, math.inf, False, why) for name, why in unsafe]
            candidates = [b for b in candidates if b.name not in dict(unsafe)]  # nor in a split's pieces
            bar = progress.for_graph(ir.name, len(candidates)) if tuned else None
            try:
                results = (
                    demotions
                    + measure(
                        ir,
                        built,
                        args,
                        mode=config.mode,
                        options=config.options_for,
                        time_budget=float(config.get("autotune_budget")),
                        timed=config.auto,
                        progress=bar,
                        deadline=self._deadline,
                    )
                    if checked
                    else self._unverified(ir, built, args)
                )
            finally:
                if bar is not None:
                    bar.close()
            if config.auto:
                screen.remember(ir, results, device)
                results = list(results) + [Measurement(name, math.inf, False, why) for name, why in left_out.items()]
            if config.auto and config.split_segments and len(candidates) > 1 and ir.is_static:
                split = try_split(
                    ir,
                    results,
                    candidates,
                    args,
                    segments=config.split_segments,
                    mode=config.mode,
                    options=config.options_for,
                    time_budget=float(config.get("autotune_budget")),
                    deadline=self._deadline,
                )
                results = list(results) + ([split] if split is not None else [])
            best = choose(results)
            failed = [m for m in results if not m.ok]
            for m in failed:  # a fault is a verdict on every graph of this structure (verdicts.py)
                if m.backend in by_name and verdicts.carried(m.reason):
                    verdicts.record(shape, by_name[m.backend], config.mode, False, m.reason)
            if not candidates and not demotions:
                why = (
                    f"backend {config.names[0]!r} does not run on {args[0].device.type if args else '?'}"
                    f"{' or with symbolic shapes' if not ir.is_static else ''}"
                )
                failed = [Measurement(config.names[0], math.inf, False, why)]
            if best is None:
                best = self._eager_fallback(ir, args)
                results = list(results) + [best]
            for m in results:
                registry.notify(
                    "torchmux_candidate_measured",
                    ir=ir,
                    backend=m.backend,
                    seconds=m.seconds,
                    ok=m.ok,
                    reason=m.reason,
                    chosen=m is best,
                    eager_ops=m.placement.eager_summary if m.ok and m.placement is not None else "",
                )
            failed = [m for m in failed if not m.quiet]  # warned about on this graph at another size
            if failed and (not config.auto or settings.VERBOSE.get()):
                warn_at(
                    f"torchmux: on graph {ir.name} ({len(ir.op_nodes)} ops), "
                    + "; ".join(f"{m.backend} {m.reason}" for m in failed)
                    + f". Running it on {best.backend} instead.",
                    TorchmuxFallbackWarning,
                    self._where,
                )
            decision = Decision(best, list(results))
            if tuned and best.ok:
                cache.store(key, self._record(decision))
                progress.summary(
                    f"{ir.name}: {decision.backend} won among {len(candidates)} backends ("
                    + ", ".join(m.summary for m in results)
                    + ")"
                )
        if role == "leader":
            distributed.publish(rank_key, self._record(decision))
        if settings.VERBOSE.get():
            print(
                f"[torchmux] {ir.name} {list(sig)[:2]}: "
                + " | ".join(m.summary for m in decision.measurements)
                + f" -> {decision.backend}",
                file=sys.stderr,
            )
        self.decisions[sig] = decision
        ranked = [decision.chosen] + sorted(
            (m for m in decision.measurements if m is not decision.chosen and m.ok),
            key=lambda m: m.seconds if m.seconds == m.seconds else math.inf,
        )
        keyed = [i for i, kind in enumerate(ir.input_kinds) if kind == "input"]
        return Guard(
            ir,
            sig,
            keyed,
            verify.policy_of(config.get("verify")),
            ranked,
            lambda: self._eager_fallback(ir, args),
            checked_first=False,
            structure=shape,
            mode=config.mode,
        )

    def _record(self, decision: Decision) -> dict[str, Any]:
        """A decision as the cache, the fleet and the other ranks keep it (JSON)."""
        best = decision.chosen
        return {
            "backend": best.backend,
            "plan": best.placement.plan if best.placement else None,
            "graph": self.ir.name,
            "ops": len(self.ir.op_nodes),
            "created": time.time(),
            "measurements": [
                {
                    "backend": m.backend,
                    "seconds": m.seconds if m.ok and math.isfinite(m.seconds) else None,
                    "reason": m.reason,
                }
                for m in decision.measurements
            ],
        }

    def _rank0_failed(self, ir: GraphIR, args: Sequence[Any]) -> Decision:
        warn_at(
            f"torchmux: rank 0's choice for graph {ir.name} fails on this rank; running it eagerly",
            TorchmuxFallbackWarning,
            self._where,
        )
        best = self._eager_fallback(ir, args)
        return Decision(best, [best])

    def _symbolic_fallback(self, args: Sequence[Any]) -> Measurement:
        """One eager placement serves every size of a symbolic graph."""
        if self._symbolic_eager is None:
            self._symbolic_eager = self._eager_fallback(self.ir, args)
        return self._symbolic_eager

    def _decide_symbolic(self, sig: tuple, args: Sequence[Any]) -> Any:
        assert self.symbolic is not None
        decision, fn = self.symbolic.choose(sig, args, self._candidates(args))
        if decision is None or fn is None:
            failed = decision.measurements if decision is not None else self.symbolic.last_results
            best = self._symbolic_fallback(args)
            decision, fn = Decision(best, list(failed) + [best]), best.placement.fn  # type: ignore[union-attr]
            loud = [m for m in failed if not m.ok and not m.quiet]  # each failure is warned about once
            if loud or not failed:
                warn_at(
                    f"torchmux: graph {self.ir.name} at sizes {symbol_values(self.ir, args)}: no backend of "
                    f"{self.config.names} ran it ({'; '.join(f'{m.backend} {m.reason}' for m in loud) or 'none runs here'}). "
                    "Running it eagerly; a backend with dynamic_shapes (torchmux list) compiles it once for every size.",
                    TorchmuxFallbackWarning,
                    self._where,
                )
            for m in loud:
                m.quiet = True
        if settings.VERBOSE.get():
            key = describe_range(size_range(symbol_values(self.ir, args)))
            print(
                f"[torchmux] {self.ir.name} ({key}): "
                + " | ".join(m.summary for m in decision.measurements)
                + f" -> {decision.backend}",
                file=sys.stderr,
            )
        self.decisions[sig] = decision
        self._fns[sig] = fn
        return fn

    def _rebuilt(self, ir: GraphIR, sig: tuple, candidates: list, args: Sequence[Any]) -> Decision | None:
        """After a weight change: the backend that won before, built on the new weights and checked."""
        name = self._rebuild.pop(sig, None)
        winner = next((b for b in candidates if b.name == name), None)
        if winner is None:
            return None
        chosen = measure(
            ir,
            [winner],
            args,
            mode=self.config.mode,
            options=self.config.options_for,
            timed=False,
            deadline=self._deadline,
        )[0]
        return (
            Decision(chosen, [chosen] + [m for m in self.decisions[sig].measurements if m.backend != name])
            if chosen.ok
            else None
        )

    def _remembered(
        self,
        ir: GraphIR,
        sig: tuple,
        candidates: list,
        args: Sequence[Any],
        frozen: bool = False,
        record: dict[str, Any] | None = None,
    ) -> Decision | None:
        """The winner a previous process (or rank 0: ``record``) measured for this graph, signature and
        candidate set, if it is still correct; None sends the graph through the full measurement."""
        if len(candidates) < 2:
            return None
        config = self.config
        if record is None:
            record = cache.load(
                cache.decision_key(self.ir, sig, candidates, config.mode, config.split_segments, frozen)
            )
        if not record:
            return None
        if record.get("plan"):
            chosen = self._remembered_split(ir, record["plan"], candidates, args)
        else:
            winner = next((b for b in candidates if b.name == record.get("backend")), None)
            chosen = (
                winner
                and measure(
                    ir,
                    [winner],
                    args,
                    mode=config.mode,
                    options=config.options_for,
                    timed=False,
                    deadline=self._deadline,
                )[0]
            )
        if chosen is None or not chosen.ok:
            return None
        try:
            remembered = [
                Measurement(
                    m["backend"],
                    m["seconds"] if m["seconds"] is not None else math.inf,
                    m["seconds"] is not None,
                    m.get("reason", "") or "(remembered)",
                )
                for m in record.get("measurements", [])
                if m["backend"] != chosen.backend
            ]
            chosen.seconds = next(
                (
                    m["seconds"]
                    for m in record.get("measurements", [])
                    if m["backend"] == chosen.backend and m["seconds"] is not None
                ),
                math.nan,
            )
        except (KeyError, TypeError, AttributeError):  # a damaged record still names a checked winner
            remembered = []
        return Decision(chosen, [chosen] + remembered)

    def _remembered_split(self, ir: GraphIR, record: Any, candidates: list, args: Sequence[Any]) -> Measurement | None:
        """Rebuild a remembered split (each piece on the backend it won), checked, not timed."""
        plan = Plan.from_record(record)
        try:
            placement = plan and build_split(
                ir,
                plan,
                candidates,
                args,
                mode=self.config.mode,
                options=self.config.options_for,
                deadline=self._deadline,
            )
            if not placement or verify.check_call(ir, placement.fn, args, twice=True)[1]:
                return None
        except Exception:
            return None
        return Measurement(placement.backend, math.nan, True, placement=placement)

    def _unverified(self, ir: GraphIR, candidates: list, args: Sequence[Any]) -> list[Measurement]:
        out = []
        for b in candidates:
            try:
                build = partial(
                    build_placement, ir, b, args, mode=self.config.mode, options=self.config.options_for(b.name)
                )
                p = within_deadline(build, self._deadline)
                out.append(Measurement(b.name, math.nan, True, placement=p))
            except TrialTimeout:
                out.append(Measurement(b.name, math.inf, False, f"timed out after {self._deadline:g} s (compile)"))
            except Exception as e:
                out.append(Measurement(b.name, math.inf, False, f"compile failed: {type(e).__name__}: {e}"))
        return out

    def _eager_fallback(self, ir: GraphIR, args: Sequence[Any]) -> Measurement:
        eager = get_registry().get("eager")
        return Measurement("eager", math.nan, True, placement=build_placement(ir, eager, args, mode=None, options={}))

    # ------------------------------------------------------------------------------------------
    def placements(self) -> list[Decision]:
        return list(self.decisions.values())
