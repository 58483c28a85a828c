"""The callable a graph runs through after its backend is chosen: checks it on schedule, demotes it.

:class:`Guard` runs the chosen backend's compiled graph and applies the checking policy of verify.py.
A check that fails, or a call that raises, demotes the backend for this graph and signature (on disk
too) with one :class:`TorchmuxFallbackWarning` at the user's line; the call is answered by the
reference (wrong answer) or by the next correct candidate (exception), eager at worst. An exception
that eager raises as well is the user's own and reaches the user unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from ..core.errors import TorchmuxFallbackWarning
from ..core.ir import GraphIR, op_name
from ..core.registry import get_registry
from ..core.userframe import warn_at
from . import verdicts, verify
from .tuner import Measurement, short_error


class Guard:
    def __init__(
        self,
        ir: GraphIR,
        signature: tuple,
        keyed: Sequence[int],
        policy: str,
        ranked: Sequence[Measurement],
        fallback: Callable[[], Measurement],
        checked_first: bool,
        structure: str = "",
        mode: str | None = None,
    ) -> None:
        self.ir, self.signature, self.keyed, self.policy = ir, signature, list(keyed), policy
        self.structure, self.mode = structure, mode  # a demotion is a verdict on every size (verdicts.py)
        self._ranked = [m for m in ranked if m.ok and m.placement is not None]  # fastest first
        self._fallback = fallback
        self.calls = 0
        self.kinds: set[tuple] = set()
        self._next = 1  # the next call the sparse schedule checks
        # the check budget (verify.CHECK_BUDGET): seconds the checks cost beyond the calls they answered,
        # what an unchecked call costs (timed once after each check: call number _probe), the last check's cost
        self.spent, self.call_seconds, self._probe, self._last_cost = 0.0, 0.0, 0, 0.0
        self.budget = verify.CHECK_BUDGET
        self._checked_first = checked_first
        self._random = verify.is_random(ir)
        self.demotions: list[tuple[str, str]] = []
        self._select()

    @property
    def backend(self) -> str:
        return self.chosen.backend

    def _select(self) -> None:
        if not self._ranked:
            self._ranked = [self._fallback()]
        self.chosen = self._ranked[0]
        self.fn = self.chosen.placement.fn  # type: ignore[union-attr]
        self._trusted = self.chosen.backend == "eager"  # the reference's own ops: nothing to check
        try:
            unsafe = get_registry().get(self.chosen.backend).nonfinite_unsafe
        except Exception:  # noqa: BLE001 -- a split or a Backend object outside the registry: nothing declared
            unsafe = frozenset()
        self._watch_nonfinite = bool(set(unsafe) & {op_name(n) for n in self.ir.op_nodes})
        self._sparse = self.policy == "sparse" and not self._trusted

    def __call__(self, *args: Any) -> Sequence[Any]:
        self.calls = calls = self.calls + 1
        if self._sparse:  # the default policy's common call, inlined: one frame for the scan, none for the schedule
            kind = verify.input_kind(args, self.keyed)
            due = (
                calls >= self._next  # the schedule's next check (or the first call: _next is 1)
                or kind not in self.kinds
                or (self._watch_nonfinite and ("nan" in kind or "inf" in kind))
            ) and self._due_kind(kind)
        else:
            due = not (self._trusted or self.policy == "off") and self._due(args)
        if not due:
            if calls == self._probe:  # the unchecked call after a check: timed, for the check budget
                return self._timed(args)
            try:  # _run, inlined: this is every call's path
                return self.fn(*args)
            except Exception as e:
                if self._trusted:
                    raise  # eager raised it: the user's own exception
                return self._demote(f"raised {short_error(e)} on call {self.calls}", args)
        try:
            t0 = perf_counter()
            out, wrong = verify.check_call(self.ir, self.fn, args, twice=False)
            self._last_cost = max(perf_counter() - t0 - self.call_seconds, 0.0)  # beyond the call it answered
            self.spent += self._last_cost
            self._probe = calls + 1
        except Exception as e:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
            return self._demote(f"raised {short_error(e)} on call {self.calls}", args)
        if wrong is None:
            return out  # type: ignore[return-value]
        reference = self.ir.run_reference(*verify.clone_inputs(args, self.ir.input_kinds))
        self._demote(f"{wrong} (on call {self.calls}, checked by the verify policy {self.policy!r})", None)
        return reference

    def _due(self, args: Sequence[Any]) -> bool:
        """Whether this call is checked (verify.py's policy)."""
        if self.policy == "always":
            return True
        if self.policy == "first":
            return self.calls == 1 and not self._checked_first
        return self._due_kind(verify.input_kind(args, self.keyed))

    def _timed(self, args: Sequence[Any]) -> Sequence[Any]:
        t0 = perf_counter()
        try:
            out = self.fn(*args)
        except Exception as e:
            if self._trusted:
                raise
            return self._demote(f"raised {short_error(e)} on call {self.calls}", args)
        self.call_seconds = perf_counter() - t0
        return out

    def _due_kind(self, kind: tuple) -> bool:
        """The sparse policy: whether a call whose inputs are of ``kind`` is checked (verify.py: the
        schedule, new kinds of input, and the check budget, which only ever postpones a scheduled check)."""
        new_kind = kind not in self.kinds
        self.kinds.add(kind)
        calls = self.calls
        if calls == 1:
            self._next = 2
            return not self._checked_first
        if (self._watch_nonfinite and any(k in ("nan", "inf") for k in kind)) or new_kind:
            if calls >= self._next:  # it stands for the scheduled check too
                self._next = verify.next_scheduled(calls)
            # a new kind, or an op the backend's claims mark unsafe on NaN/inf (then every such call): checked
            return True
        if calls < self._next:
            return False
        # a scheduled check (or one the budget postponed): taken once the checks, this one included, cost
        # at most ``budget`` of the time the graph's calls took so far
        allowed = verify.within_budget(calls, self.spent + self._last_cost, self.call_seconds, self.budget)
        if calls > verify.BUDGET_AFTER and allowed > calls:
            self._next = allowed
            return False
        self._next = verify.next_scheduled(calls)
        return True

    def _demote(self, reason: str, args: Sequence[Any] | None) -> Any:
        """Stop using the chosen backend for this graph; answer ``args`` (if given) with the next candidate."""
        bad = self.chosen.backend
        self.demotions.append((bad, reason))
        if bad in get_registry().names:  # a Backend object outside the registry: remembered in this process only
            verify.remember_demotion(self.ir, self.signature, get_registry().get(bad), reason)
            verdicts.record(self.structure, get_registry().get(bad), self.mode, False, f"demoted: {reason}")
        self._ranked = self._ranked[1:]
        self._select()
        warn_at(
            f"torchmux: backend {bad!r} demoted on graph {self.ir.name} ({len(self.ir.op_nodes)} ops): {reason}. "
            f"Running it on {self.chosen.backend} from now on.",
            TorchmuxFallbackWarning,
        )
        return self(*args) if args is not None else None
