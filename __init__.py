"""torchmux: make unmodified PyTorch programs fast by letting every backend compete, per graph."""

from __future__ import annotations

from .api.compile import compile
from .api.explain import ExplainReport, explain
from .api.export import ExportedModel, LoadedModel, PackageInputError, export, load
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
