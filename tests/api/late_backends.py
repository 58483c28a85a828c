"""Two real backends made late on some ops, for split packages: ONNX Runtime late on matrix products,
eager late on tanh/sigmoid. Each loses a graph holding both, and each wins the piece the other is
late on; the lateness is saved with the artifact, so the loaded pieces (what export times and what a
package runs) are late or not as their compiled forms were. Import it and call :func:`register`
(a test, or a child process's preamble)."""

from __future__ import annotations

import time
from typing import Any

import torchmux
from torchmux.backends.eager import EagerBackend
from torchmux.backends.onnxruntime import OnnxRuntimeBackend
from torchmux.core.backend import SavedGraph
from torchmux.core.ir import op_name

DELAY = 0.02


class _Late:
    def __init__(self, fn: Any, late: bool) -> None:
        self.fn, self.late = fn, late

    def __call__(self, *args: Any) -> Any:
        if self.late:
            time.sleep(DELAY)
        return self.fn(*args)


class _Mixin:
    slow_ops: frozenset[str] = frozenset()
    auto = True

    def compile(self, request: Any) -> Any:
        late = any(op_name(n) in self.slow_ops for n in request.ir.op_nodes)
        return _Late(super().compile(request), late)  # type: ignore[misc]

    def save(self, compiled: Any, request: Any) -> Any:
        saved = super().save(compiled.fn, request)  # type: ignore[misc]
        return saved and SavedGraph(saved.files, {**saved.meta, "late": compiled.late}, saved.native)

    def load(self, request: Any) -> Any:
        meta = dict(request.saved.meta)
        late = bool(meta.pop("late", False))
        inner = type(request)(SavedGraph(request.saved.files, meta, request.saved.native), *_rest(request))
        return _Late(super().load(inner), late)  # type: ignore[misc]


def _rest(request: Any) -> tuple:
    return (request.device, request.threads, request.options, request.program, request.weights)


class LateOnProducts(_Mixin, OnnxRuntimeBackend):
    name = "late_products"
    slow_ops = frozenset({"aten.mm.default"})


class LateOnPointwise(_Mixin, EagerBackend):
    name = "late_pointwise"
    slow_ops = frozenset({"aten.tanh.default", "aten.sigmoid.default"})


def register() -> None:
    for backend in (LateOnProducts(), LateOnPointwise()):
        if backend.name not in torchmux.core.registry.get_registry().names:
            torchmux.register_plugin(backend)
