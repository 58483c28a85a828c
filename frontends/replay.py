"""Replay: a compiled module's later calls run Dynamo's cached code for its ``forward`` directly, when
Dynamo's own guards say that this code is what Dynamo would run.

Why. On a cache hit Dynamo's work around the graph is small in instructions but wide in memory: the
module's ``__call__`` twice (the wrapper's and the model's), the eval-frame switches, the walk of the
code's cache, then the guards. After a real model's run has pushed those objects out of the CPU's
caches, it costs ~100 us a call; the guards themselves are ~10-25 us of it
(``python -m torchmux.bench.scripts.dispatch_overhead --model vit --batch-size 1``: ONNX Runtime's
session 240 us alone, 366 us behind Dynamo, 343 us behind Dynamo with no guards). ONNX Runtime used
directly pays none of it, and on short calls that is the whole difference.

What a replayed call does: it binds the call's arguments to ``forward``'s parameters as the frame
would (defaults filled, the closure's cells), takes the first entry of Dynamo's cache for that code
that this torchmux backend compiled and whose guards pass on those locals (Dynamo's own C++ guard tree:
the inputs' specs, grad mode and the rest of torch's global state, every module attribute and weight
the trace read), and calls that entry's transformed code as a plain function. That code is what Dynamo
would run on the hit: the graph's call, the outputs rebuilt into the user's structure, the side
effects replayed. The answer is Dynamo's, bit for bit; only the frame machinery around it is skipped.

When a call is not replayed (it goes through Dynamo as before, which compiles or falls back as usual):
keyword arguments; a hook on the module or a global one (``nn.Module._call_impl`` would run it); a
``forward`` reassigned since; a Dynamo trace or a JIT trace around the call; a ``torch.compiler``
stance other than the default; no entry whose guards pass; or an entry whose code has a graph break
(the code after a break is a resume function, which only Dynamo's frame machinery would compile: run
directly it would run eagerly). Weights changed in place are still noticed: the graph's frozen-weights
check runs inside the graph call. ``options={"replay": False}`` turns it off.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
import torch.nn.modules.module as module_hooks

#: what :meth:`Replay.__call__` returns when the call must go through Dynamo
MISS: Any = object()

_eval_frame: Any = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
_entries: Any = getattr(_eval_frame, "_debug_get_cache_entry_list", None)  # a code's cache entries, in order
_callback: Any = getattr(_eval_frame, "get_eval_frame_callback", None)  # None outside Dynamo's frames
_dynamo_eval: Any = torch._dynamo.eval_frame  # its ._stance: torch.compiler.set_stance's (rebound by each call)


class Replay:
    """Runs ``module``'s Dynamo-compiled ``forward`` without Dynamo's frame machinery (see above).

    ``backend`` is the Dynamo backend object ``torch.compile`` was given: an entry compiled by another
    backend (the same class compiled again elsewhere) is never run here, as Dynamo would not run it."""

    __slots__ = ("_backend", "_bind", "_forward", "_functions", "_module", "hits")

    def __init__(self, module: torch.nn.Module, backend: Any) -> None:
        self._module, self._backend = module, backend
        forward: Any = getattr(module.forward, "__func__", None)  # the function Dynamo compiled
        if not isinstance(forward, types.FunctionType):
            forward = None
        self._forward: Any = forward
        # id of a transformed code -> (that code, its function; None: not replayable). By id: a code object
        # hashes its constants, and Dynamo's transformed code can hold a dict among them (unhashable: the
        # lookup raised TypeError out of the user's call); the code is kept, so its id is not reused
        self._functions: dict[int, tuple[types.CodeType, Any]] = {}
        self._bind = _binder(forward) if forward is not None else None
        self.hits = 0  # calls replayed (for tests and diagnostics)

    @staticmethod
    def available() -> bool:
        """Whether this torch has what replay reads (its cache entries, the eval-frame callback)."""
        return (
            _entries is not None and _callback is not None and hasattr(getattr(_dynamo_eval, "_stance", None), "stance")
        )

    def __call__(self, args: tuple) -> Any:
        module, bind = self._module, self._bind
        forward: Any = self._forward
        if (
            bind is None
            or module._forward_hooks
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
            or module_hooks._global_forward_hooks
            or module_hooks._global_forward_pre_hooks
            or module_hooks._global_backward_hooks
            or module_hooks._global_backward_pre_hooks
            or _callback() is not None  # inside a Dynamo trace, or Dynamo's own frame
            or torch._C._get_tracing_state() is not None
            or getattr(module.forward, "__func__", MISS) is not forward
            or _dynamo_eval._stance.stance != "default"
        ):
            return MISS
        f_locals = bind(module, args)
        if f_locals is None:
            return MISS
        for entry in _entries(forward.__code__):
            if getattr(entry.backend, "compiler_fn", None) is not self._backend or not entry.guard_manager.check(
                f_locals
            ):
                continue
            code = entry.code
            known = self._functions.get(id(code))
            if known is None or known[0] is not code:
                known = self._functions[id(code)] = (code, _transformed(forward, code))
            fn = known[1]
            if fn is None:
                return MISS
            self.hits += 1
            return fn(module, *args)
        return MISS


def _binder(forward: types.FunctionType) -> Any:
    """A function ``(self, args) -> f_locals`` for a positional call of ``forward`` (None where the
    call would not bind: too many or too few arguments), as the frame's locals are at its start."""
    code = forward.__code__
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        return None
    positional = code.co_varnames[: code.co_argcount]
    kwonly = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    after = code.co_argcount + code.co_kwonlyargcount
    varargs = code.co_varnames[after] if code.co_flags & inspect.CO_VARARGS else None
    varkw = code.co_varnames[after + (varargs is not None)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    defaults = forward.__defaults__ or ()
    kwdefaults = forward.__kwdefaults__ or {}
    if any(name not in kwdefaults for name in kwonly):
        return lambda module, args: None  # a required keyword-only argument: never given positionally
    required = len(positional) - len(defaults)
    cells = dict(zip(code.co_freevars, forward.__closure__ or ()))

    def bind(module: Any, args: tuple) -> dict[str, Any] | None:
        given = (module, *args)
        if len(given) < required or (len(given) > len(positional) and varargs is None):
            return None
        f_locals = dict(zip(positional, given))
        for name, default in zip(positional[len(positional) - len(defaults) :], defaults):
            f_locals.setdefault(name, default)
        f_locals.update(kwdefaults)
        if varargs is not None:
            f_locals[varargs] = given[len(positional) :]
        if varkw is not None:
            f_locals[varkw] = {}
        for name, cell in cells.items():
            try:
                f_locals[name] = cell.cell_contents
            except ValueError:  # an empty cell: not a local yet
                pass
        return f_locals

    return bind


def _transformed(forward: Any, code: types.CodeType) -> types.FunctionType | None:
    """Dynamo's transformed code for ``forward`` as a plain function, or None when it holds a graph
    break (a resume function) or does not fit ``forward``'s closure."""
    if any(name.startswith("__resume_at") for name in code.co_names) or any(
        isinstance(c, types.CodeType) and c.co_name.startswith("torch_dynamo_resume_in") for c in code.co_consts
    ):
        return None
    if code.co_freevars != forward.__code__.co_freevars:
        return None
    fn = types.FunctionType(code, forward.__globals__, forward.__name__, forward.__defaults__, forward.__closure__)
    fn.__kwdefaults__ = forward.__kwdefaults__
    return fn
