"""torchmux: make unmodified PyTorch programs fast by letting every backend compete, per graph."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core.backend import Availability, Backend, CompiledGraph, CompileRequest
from .core.errors import (
    BackendUnavailableError,
    BadArgumentError,
    FullGraphError,
    IRLintError,
    PluginError,
    TorchmuxError,
    TorchmuxFallbackWarning,
    UnknownBackendError,
)
from .core.hookspecs import hookimpl
from .core.ir import GraphIR, ReferenceInterpreter, TensorSpec
from .core.registry import BackendInfo, list_backends, register_plugin
from .core.version import __version__

if TYPE_CHECKING:
    from .api.compile import compile
    from .api.explain import ExplainReport, explain
    from .api.export import ExportedModel, export
    from .api.load import LoadedModel, PackageInputError, load

# compile() and explain() bring TorchDynamo (seconds to import); a process that only loads a package
# (torchmux.load) never needs it: the API is imported on first use
_LAZY = {
    "compile": ".api.compile",
    "explain": ".api.explain",
    "ExplainReport": ".api.explain",
    "export": ".api.export",
    "load": ".api.load",
    "ExportedModel": ".api.export",
    "LoadedModel": ".api.load",
    "PackageInputError": ".api.load",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmux' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Availability",
    "Backend",
    "BackendInfo",
    "BackendUnavailableError",
    "BadArgumentError",
    "CompileRequest",
    "CompiledGraph",
    "ExplainReport",
    "ExportedModel",
    "LoadedModel",
    "PackageInputError",
    "FullGraphError",
    "GraphIR",
    "IRLintError",
    "PluginError",
    "ReferenceInterpreter",
    "TensorSpec",
    "TorchmuxError",
    "TorchmuxFallbackWarning",
    "UnknownBackendError",
    "compile",
    "explain",
    "export",
    "hookimpl",
    "list_backends",
    "load",
    "register_plugin",
    "__version__",
]
