"""Plugin backends that misbehave on purpose, for tests/autotune/test_faults.py.

A module (not classes inside the test) so that an isolated trial's child process can import it and
rebuild the backend by name. Each computes the graph with its own ``forward`` and then does one thing wrong.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch

import torchmux


class _Fault(torchmux.Backend):
    name = ""
    auto = False  # registered for the whole test session: "auto" in other tests must never pick these up

    def compile(self, request):
        forward = request.ir.gm.forward
        state = {"calls": 0}

        def run(*a):
            state["calls"] += 1
            return self.fault(list(forward(*a)), a, state["calls"])

        return run

    def fault(self, out, args, call):
        return out


class Honest(_Fault):
    name = "fault_none"  # does nothing wrong: the control


class WrongLate(_Fault):
    name = "fault_wrong_late"  # right twice (the first check calls twice), wrong from its third call on

    def fault(self, out, args, call):
        return [o + 1 for o in out] if call >= 3 else out


class WrongOnNaN(_Fault):
    name = "fault_wrong_nan"  # turns NaN into 0, as TVM's relu did

    def fault(self, out, args, call):
        return [o.nan_to_num(0.0) for o in out]


class MutatesInput(_Fault):
    name = "fault_mutates_input"

    def fault(self, out, args, call):
        args[0].add_(1)
        return out


class AliasesInput(_Fault):
    name = "fault_aliases_input"  # returns the answer in its input's buffer

    def fault(self, out, args, call):
        return [args[0].copy_(out[0])]


class ReusesBuffer(_Fault):
    name = "fault_reuses_buffer"
    buf: torch.Tensor | None = None

    def fault(self, out, args, call):
        if self.buf is None:
            self.buf = torch.empty_like(out[0])
        return [self.buf.copy_(out[0])]


class RaisesOnFifth(_Fault):
    name = "fault_raises_5th"

    def fault(self, out, args, call):
        if call >= 5:
            raise RuntimeError("kernel launch failed (on purpose)")
        return out


class Aborts(_Fault):
    name = "fault_abort"

    def fault(self, out, args, call):
        os.abort()


class Segfaults(_Fault):
    name = "fault_segfault"

    def fault(self, out, args, call):
        ctypes.string_at(0)


class HangsInCall(_Fault):
    name = "fault_hang_call"

    def fault(self, out, args, call):
        time.sleep(3600)


class HangsInCompile(_Fault):
    name = "fault_hang_compile"

    def compile(self, request):
        time.sleep(3600)


class AbortsUnderGrad(_Fault):
    """Honest when built as torchmux builds it (under ``no_grad``); aborts if a trial builds it otherwise."""

    name = "fault_abort_under_grad"
    compiled_here = 0  # builds in this process

    def compile(self, request):
        if torch.is_grad_enabled():
            os.abort()
        AbortsUnderGrad.compiled_here += 1
        return super().compile(request)


class RaisingObserver:
    """A plugin whose observer raises."""

    @staticmethod
    @torchmux.hookimpl
    def torchmux_graph_captured(ir):
        raise ValueError("observer broken on purpose")


@torchmux.hookimpl
def torchmux_add_backends():
    return [
        Honest(),
        WrongLate(),
        WrongOnNaN(),
        MutatesInput(),
        AliasesInput(),
        ReusesBuffer(),
        RaisesOnFifth(),
        Aborts(),
        AbortsUnderGrad(),
        Segfaults(),
        HangsInCall(),
        HangsInCompile(),
    ]
