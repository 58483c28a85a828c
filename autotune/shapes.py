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

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.ir import GraphIR
from . import verdicts

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
    compiled once, static backends specialized up to :data:`SPECIALIZE_LIMIT` signatures.

    Every backend gets what the runner gives a static graph (runner.py): an isolated trial in a child
    (on the graph at this call's sizes, a static graph of the same structure: a symbolic graph does not
    pickle into a child), unless a trial on a graph of the same structure gave a verdict already
    (verdicts.py: a backend that crashed, hung, answered wrong or wrote into its inputs on the first
    shape is not tried again); its compile and first two calls under one trial deadline, checked on
    copies of the inputs (answer, inputs untouched, no input's memory returned, no output buffer
    reused); and then a :class:`~torchmux.autotune.guard.Guard` that checks the user's calls on the
    verify policy's schedule and demotes it to eager (``fallback``) on the first wrong answer.
    """

    def __init__(
        self,
        ir: GraphIR,
        config: Any,
        fallback: Callable[[Sequence[Any]], Any] | None = None,
        structure: str = "",
    ) -> None:
        self.ir = ir
        self.config = config
        self.fallback = fallback  # args -> the eager Measurement of this graph (the runner's)
        self.structure = structure  # verdicts.py: what the verdicts on this graph are carried under
        self.compiled: dict[str, Any] = {}  # backend name -> Placement of the symbolic graph
        self.failed: dict[str, str] = {}  # backend name -> why it cannot run this graph
        self.hung: dict[str, str] = {}  # backend name -> crashed or hung in its trial: never tried again
        self.specialized: dict[str, int] = {}  # backend name -> how many signatures it was specialized for
        self.ranges: dict[tuple, Any] = {}  # size range (and signature) -> (Decision, own, own_sig)
        self.guards: dict[tuple, Any] = {}  # (size range, signature or None) -> the Guard serving it
        self.compiles: dict[str, int] = {}  # backend name -> compiles made for this graph (for reports and tests)
        self.last_results: list[Any] = []  # the last tuning's measurements (failures name their reason)

    # ------------------------------------------------------------------------------------------
    def choose(self, sig: tuple, args: Sequence[Any], candidates: Sequence[Any]) -> tuple[Any, Any]:
        """(Decision, fn) for this call: the range's winner, tuned now if the range is new, in its Guard."""
        key = size_range(symbol_values(self.ir, args))
        if key not in self.ranges:
            self.ranges[key] = self._tune(key, args, candidates)
        decision, own, own_sig = self.ranges[key]
        if decision is None:
            return None, None
        where: tuple = (key, own_sig)
        ranked = _ranked(decision, lambda m: True)
        if own_sig is not None and own_sig != sig:  # a specialization serves only its own sizes
            ranked = _ranked(decision, lambda m: not own.get(m.backend))
            where = (key, None)
            if not ranked:  # no symbolic backend ran it: specialize again (bounded)
                if (key, sig) not in self.ranges:
                    self.ranges[(key, sig)] = self._tune(key, args, candidates)
                decision, _, _ = self.ranges[(key, sig)]
                if decision is None:
                    return None, None
                where, ranked = (key, sig), _ranked(decision, lambda m: True)
        if where not in self.guards:
            self.guards[where] = self._guard(where, ranked, args)
        return decision, self.guards[where]

    def _guard(self, where: tuple, ranked: list[Any], args: Sequence[Any]) -> Any:
        from . import verify
        from .guard import Guard

        fallback = self.fallback
        return Guard(
            self.ir,
            ("range", *where),
            [i for i, kind in enumerate(self.ir.input_kinds) if kind == "input"],
            verify.policy_of(self.config.get("verify")),
            ranked,
            (lambda: fallback(args)) if fallback is not None else _no_fallback,
            checked_first=False,
            structure=self.structure,
            mode=self.config.mode,
        )

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

    def _static_placement(self, backend: Any, args: Sequence[Any], at: tuple[GraphIR, list[int]] | None = None) -> Any:
        """``backend`` compiled on the graph specialized to the sizes of ``args`` (``at``, if made already)."""
        from .placement import build_placement

        if self.specialized.get(backend.name, 0) >= SPECIALIZE_LIMIT:
            raise RuntimeError(
                f"already specialized for {SPECIALIZE_LIMIT} signatures (its limit; it needs static shapes)"
            )
        self.specialized[backend.name] = self.specialized.get(backend.name, 0) + 1
        static, keep = at or specialize(self.ir, args)
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

    def _isolated(self, backend: Any, args: Sequence[Any], at: Callable[[], tuple[GraphIR, list[int]] | None]) -> str:
        """Why ``backend`` must not run in this process ("" if it may): its isolated trial on the graph at
        this call's sizes (``at()``), or the verdict of a trial on a graph of the same structure."""
        from . import isolate
        from .runner import _signature

        config = self.config
        if not isolate.wanted(backend, config.isolation):
            return ""
        old = verdicts.recall(self.structure, backend, config.mode)
        if old is not None:
            return "" if old.ok else old.reason
        specialized = at()
        if specialized is None:  # the graph cannot be made static at these sizes: run as an unpicklable graph
            return ""
        static, keep = specialized
        static_args = [args[i] for i in keep]
        _, failed = isolate.screen(
            static,
            _signature(static_args, [i for i, kind in enumerate(static.input_kinds) if kind == "input"]),
            [backend],
            static_args,
            mode=config.mode,
            options=config.options_for,
            isolation=config.isolation,
            deadline=config.trial_deadline,
            structure=self.structure,
        )
        return failed[0][1] if failed else ""

    def _tune(self, key: tuple, args: Sequence[Any], candidates: Sequence[Any]) -> tuple[Any, Any, Any]:
        """(Decision or None, backend name -> specialized?, the signature a specialized winner serves or None)."""
        import math
        import time
        from functools import partial

        from . import decisions as cache
        from .tuner import Decision, Measurement, TrialTimeout, choose, short_error, time_rounds, within_deadline
        from .verify import check_call, clone_inputs

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
        reference = self.ir.run_reference(*clone_inputs(args, self.ir.input_kinds))
        results: list[Measurement] = []
        live = []
        own: dict[str, bool] = {}
        made: list[Any] = []  # the graph specialized to these sizes, once made (trials and static backends share it)

        def at() -> tuple[GraphIR, list[int]] | None:
            if not made:
                try:
                    made.append(specialize(self.ir, args))
                except Exception:  # noqa: BLE001 -- a graph make_fx cannot specialize: no trial, no static backend
                    made.append(None)
            return made[0]

        for b in candidates:
            if b.name in self.hung:
                results.append(Measurement(b.name, math.inf, False, self.hung[b.name], quiet=True))
                continue
            old = verdicts.recall(self.structure, b, config.mode)
            if old is not None and not old.ok:  # it failed on this graph at another size
                reason = f"failed on this graph at other sizes: {old.reason}"
                results.append(Measurement(b.name, math.inf, False, reason, quiet=old.here))
                continue
            unsafe = self._isolated(b, args, at)
            if unsafe:  # crashed or hung in its trial: never run in this process
                self.hung[b.name] = unsafe
                results.append(Measurement(b.name, math.inf, False, unsafe))
                continue
            symbolic = takes_symbolic(b) and b.name not in self.failed
            start = time.monotonic()
            try:  # compile and first checked calls under one trial deadline, as in tuner.measure
                build = self._symbolic_placement if symbolic else partial(self._static_placement, at=at())
                placement = within_deadline(partial(build, b, args), deadline)
            except TrialTimeout:
                self.hung[b.name] = f"timed out after {deadline:g} s (compile)"
                verdicts.record(self.structure, b, config.mode, False, self.hung[b.name])
                results.append(Measurement(b.name, math.inf, False, self.hung[b.name]))
                continue
            except Exception as e:
                reason = (self.failed.get(b.name) if symbolic else None) or short_error(e)
                if symbolic and not config.auto:  # it cannot take this symbolic graph: specialize it instead
                    try:
                        placement = self._static_placement(b, args, at())
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
            try:  # on copies, twice: answer, inputs untouched, no input's memory returned, no buffer reused
                left = max(deadline - (time.monotonic() - start), 1e-3)
                t0 = time.perf_counter()
                check = partial(check_call, self.ir, placement.fn, args, twice=True, reference=reference)
                _, wrong = within_deadline(check, left)
                first = time.perf_counter() - t0
            except TrialTimeout:
                self.hung[b.name] = m.reason = f"timed out after {deadline:g} s (compile and first checked calls)"
                verdicts.record(self.structure, b, config.mode, False, m.reason)
                continue
            except Exception as e:
                m.reason = f"crashed: {short_error(e)}"
                continue
            if wrong:
                m.reason = wrong
                verdicts.record(self.structure, b, config.mode, False, wrong)
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
                eager_ops=m.placement.eager_summary if m.ok and m.placement is not None else "",
            )
        if best is None:  # nothing ran it right: the graph's own ops, eagerly (the runner warns)
            return None, own, None
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
        return decision, own, own_sig


def _ranked(decision: Any, keep: Callable[[Any], bool]) -> list[Any]:
    """The decision's correct measurements that ``keep`` admits: the winner first, then the fastest first."""
    rest = sorted(
        (m for m in decision.measurements if m.ok and m is not decision.chosen and keep(m)),
        key=lambda m: m.seconds if m.seconds == m.seconds else float("inf"),
    )
    return ([decision.chosen] if keep(decision.chosen) else []) + rest


def _no_fallback() -> Any:
    raise RuntimeError("no eager fallback was given to this SymbolicChooser")
