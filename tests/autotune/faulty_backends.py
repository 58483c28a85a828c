"""Plugin backends that misbehave on purpose, for tests/autotune/test_faults.py.

A module (not classes inside the test) so that an isolated trial's child process can import it and
rebuild the backend by name. Each computes the graph with its own ``forward`` and then does one thing wrong.
"""

from __future__ import annotations

import ctypes
import json
import os
import time

import torch

import torchmux
import torchmux.extend


class _Fault(torchmux.Backend):
    name = ""
    auto = False  # registered for the whole test session: "auto" in other tests must never pick these up

    def compile(self, request):
        forward = request.ir.gm.forward
        state = {"calls": 0}
        kinds = request.ir.input_kinds

        def run(*a):
            state["calls"] += 1
            user = [x for x, k in zip(a, kinds) if k == "input" and isinstance(x, torch.Tensor)]
            return self.fault(list(forward(*a)), user, state["calls"])

        return run

    def fault(self, out, args, call):
        """``out``: the right answer; ``args``: the user's input tensors (not weights, not sizes); ``call``: 1, 2, ..."""
        return out


class Honest(_Fault):
    name = "fault_none"  # does nothing wrong: the control


class WrongLate(_Fault):
    name = "fault_wrong_late"  # right twice (the first check calls twice), wrong from its third call on

    def fault(self, out, args, call):
        return [o + 1 if o is not None else o for o in out] if call >= 3 else out


class WrongSecond(_Fault):
    name = "fault_wrong_2nd"  # right once, wrong from its second call on

    def fault(self, out, args, call):
        return [o + 0.01 if o is not None else o for o in out] if call >= 2 else out


class WrongTwentieth(_Fault):
    name = "fault_wrong_20th"  # right for 19 calls, wrong from its 20th on

    def fault(self, out, args, call):
        return [o + 1 if o is not None else o for o in out] if call >= 20 else out


class MutatesTwentieth(_Fault):
    name = "fault_mutates_20th"  # honest for 19 calls, writes into its input from its 20th on

    def fault(self, out, args, call):
        if call >= 20:
            args[0].add_(1)
        return out


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
        if args[0].numel() < out[0].numel():
            return out
        return [args[0].view(-1)[: out[0].numel()].copy_(out[0].reshape(-1)).view(out[0].shape), *out[1:]]


class ReusesBuffer(_Fault):
    name = "fault_reuses_buffer"  # one output buffer per shape, returned by every call

    def __init__(self):
        self.bufs = {}

    def fault(self, out, args, call):
        buf = self.bufs.setdefault((out[0].shape, out[0].dtype), torch.empty_like(out[0]))
        return [buf.copy_(out[0]), *out[1:]]


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


class SegfaultsOnLoad(_Fault):
    """Builds and answers right; its saved form (``torchmux.export``'s package) kills the process that loads it."""

    name = "fault_segfault_on_load"

    def save(self, compiled, request):
        return torchmux.extend.SavedGraph({"model.bin": b"\0"})

    def load(self, request):
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


class RecordsItsGraphs(_Fault):
    """Honest; writes down each graph it is given to build (which process, static or symbolic, the user
    inputs' sizes) as a JSON line in the file $FAULTY_BACKENDS_RECORD names, in a trial's child as here."""

    name = "fault_records_graphs"
    dynamic_shapes = True  # it builds a symbolic graph once for every size (its forward takes the sizes)

    def compile(self, request):
        path = os.environ.get("FAULTY_BACKENDS_RECORD")
        if path:
            ir = request.ir
            shapes = [
                [str(d) for d in n.meta["val"].shape]
                for n, k in zip(ir.placeholders, ir.input_kinds)
                if k == "input" and isinstance(n.meta.get("val"), torch.Tensor)
            ]
            with open(path, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "static": ir.is_static, "shapes": shapes}) + "\n")
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
        WrongSecond(),
        WrongTwentieth(),
        MutatesTwentieth(),
        WrongOnNaN(),
        MutatesInput(),
        AliasesInput(),
        ReusesBuffer(),
        RaisesOnFifth(),
        Aborts(),
        AbortsUnderGrad(),
        Segfaults(),
        SegfaultsOnLoad(),
        HangsInCall(),
        HangsInCompile(),
        RecordsItsGraphs(),
    ]
