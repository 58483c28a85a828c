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

#: what ``Guard._due_kind`` gives for the schedule's own check (tested by identity on the call's path)
SCHEDULED = "scheduled"


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
        self._checked_first = checked_first
        self._random = verify.is_random(ir)
        self.demotions: list[tuple[str, str]] = []
        self.budget = verify.CHECK_BUDGET
        self._select()
        # where this graph's checks stand (verify.Schedule): a build of a graph this process ran before goes on
        # from there; only its own first call is checked anew (a new build's first answer)
        self.s = verify.schedule_for(ir, signature, self.chosen.backend, policy)
        self._first = True
        self._beside = verify.can_check_beside(ir)  # whether its scheduled checks may run beside the call

    @property
    def backend(self) -> str:
        return self.chosen.backend

    @property
    def calls(self) -> int:
        """The user's calls of this graph so far (every build of it in this process)."""
        return self.s.calls

    @property
    def checks(self) -> int:
        """The checks made in those calls (verify.Schedule)."""
        return self.s.checks

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
        s = self.s
        if s.verdict is not None:  # a check beside an earlier call found a wrong answer
            self._settle()
        s.calls = calls = s.calls + 1
        if self._sparse:  # the default policy's common call, inlined: one frame for the scan, none for the schedule
            kind = verify.input_kind(args, self.keyed)
            due = (
                calls >= s.next  # the schedule's next check (or the first call: next is 1)
                or self._first
                or kind not in s.kinds
                or (self._watch_nonfinite and ("nan" in kind or "inf" in kind))
            ) and self._due_kind(kind)
        else:
            due = not (self._trusted or self.policy == "off") and self._due(args)
        if not due:
            if calls == s.probe:  # an unchecked call after a check: timed, for the check budget
                return self._timed(args)
            try:  # the unchecked call, inlined: this is every call's path
                return self.fn(*args)
            except Exception as e:
                if self._trusted:
                    raise
                return self._demote(f"raised {short_error(e)} on call {calls}", args)
        if due is SCHEDULED and self._beside and verify.beside_now():
            return self._check_beside(args)
        s.checks += 1
        first, self._first = self._first, False
        try:
            t0 = perf_counter()
            out, wrong = verify.check_call(self.ir, self.fn, args, twice=False)
            s.last_cost = max(perf_counter() - t0 - s.call_seconds, 0.0)  # beyond the call it answered
            if not first:  # a build's first check is part of the call that compiled it: not weighed
                s.spent += s.last_cost
            s.probe = calls + verify.PROBE_AFTER
        except Exception as e:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
            return self._demote(f"raised {short_error(e)} on call {calls}", args)
        if wrong is None:
            return out  # type: ignore[return-value]
        return self._answer_by_reference(wrong, calls, args)

    def _answer_by_reference(self, wrong: str, call: int, args: Sequence[Any]) -> Sequence[Any]:
        """Demote the backend a check found ``wrong`` on ``call`` and answer that call with the reference."""
        reference = self.ir.run_reference(*verify.clone_inputs(args, self.ir.input_kinds))
        self._demote(f"{wrong} (on call {call}, checked by the verify policy {self.policy!r})", None)
        return reference

    def _check_beside(self, args: Sequence[Any]) -> Sequence[Any]:
        """A scheduled check off the critical path (verify.py): the backend's answer is returned at once;
        the reference and the comparison run on the checks' worker, whose verdict the next call reads."""
        s, calls = self.s, self.calls
        s.checks += 1
        s.pending = True

        def verdict(reason: str | None, seconds: float) -> None:  # on the worker thread
            s.last_cost = max(seconds - s.call_seconds, 0.0)  # beyond the call it answered
            s.spent += s.last_cost
            if reason is not None:
                s.verdict = (reason, calls)
            s.pending = False

        try:
            out, fault = verify.check_beside(self.ir, self.fn, args, verdict)
        except Exception as e:  # noqa: BLE001 -- a backend's fault of any kind is a measurement, never the user's crash
            s.pending = False
            return self._demote(f"raised {short_error(e)} on call {calls}", args)
        s.probe = calls + verify.PROBE_AFTER
        if fault is None:
            return out
        s.pending = False
        return self._answer_by_reference(fault, calls, args)

    def _settle(self) -> None:
        """Demote the backend that a check beside an earlier call found wrong."""
        (reason, call), self.s.verdict = self.s.verdict, None  # type: ignore[misc]
        later = self.calls - call
        self._demote(
            f"{reason} (on call {call}, checked beside the call by the verify policy {self.policy!r}: that "
            f"call{f' and the {later} after it' if later else ''} returned its answer)",
            None,
        )

    def _due(self, args: Sequence[Any]) -> bool:
        """Whether this call is checked (verify.py's policy)."""
        if self.policy == "always":
            return True
        if self.policy == "first":
            first, self._first = self._first, False
            return first and not self._checked_first
        return bool(self._due_kind(verify.input_kind(args, self.keyed)))

    def _timed(self, args: Sequence[Any]) -> Sequence[Any]:
        t0 = perf_counter()
        try:
            out = self.fn(*args)
        except Exception as e:
            if self._trusted:
                raise
            return self._demote(f"raised {short_error(e)} on call {self.calls}", args)
        self.s.call_seconds = perf_counter() - t0
        return out

    def _due_kind(self, kind: tuple) -> bool | str:
        """The sparse policy: whether a call whose inputs are of ``kind`` is checked (verify.py: the
        schedule, a build's first call, new kinds of input, and the check budget, which only ever
        postpones a scheduled check, as does a check beside an earlier call still without its verdict):
        False, True (a check that answers the call), or :data:`SCHEDULED` (the schedule's own, past the
        build's first call: one that may run beside the call)."""
        s = self.s
        new_kind = kind not in s.kinds
        s.kinds.add(kind)
        calls = s.calls
        if self._first:  # this build's first call: call 1, or the first after a recompile of the graph
            if calls >= s.next:
                s.next = verify.next_scheduled(calls)
            if not self._checked_first:
                return True
            self._first = False
        if (self._watch_nonfinite and any(k in ("nan", "inf") for k in kind)) or new_kind:
            if calls >= s.next:  # it stands for the scheduled check too
                s.next = verify.next_scheduled(calls)
            # a new kind, or an op the backend's claims mark unsafe on NaN/inf (then every such call): checked
            return True
        if calls < s.next:
            return False
        if s.pending:  # the last check beside a call has no verdict yet: this one waits for it
            s.next = calls + 1
            return False
        # a scheduled check (or one the budget postponed): past call 8, taken once the checks, this one
        # included, cost at most ``budget`` of the time the graph's calls took so far
        allowed = verify.within_budget(calls, s.spent + s.last_cost, s.call_seconds, self.budget)
        if calls > verify.BUDGET_AFTER and allowed > calls:
            s.next = allowed
            return False
        s.next = verify.next_scheduled(calls)
        return SCHEDULED

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
