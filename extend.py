"""The extension kit: everything a backend needs, and the only part of torchmux a backend imports.

torchmux's own backends are written with this module alone, exactly as a third-party plugin is
(a test parses their imports to keep it so); plugins.md documents it. Nothing here is private to
the built-ins.

- The contract: :class:`Backend`, :class:`Availability`, :class:`CompileRequest`,
  :class:`CompiledGraph`, :data:`hookimpl` (hook specifications: ``torchmux.core.hookspecs``).
- The IR a backend is handed: :class:`GraphIR`, :class:`TensorSpec`, :func:`op_name` (the Core ATen
  name a claim is written in), :func:`spec_of`, :func:`node_float_dtypes`.
- Claims: :func:`load_claims` reads the conformance suite's results (``python -m
  torchmux.testing.probe NAME --write claims.json``); :func:`load_nonfinite_unsafe` the ops in it that
  differ from eager on NaN/±inf inputs (set them as ``Backend.nonfinite_unsafe``).
- Environment probes that never import the library they ask about: :func:`package_version`,
  :func:`module_present`, :func:`version_tuple`, :func:`has_cuda`.
- Artifacts: :func:`artifact_dir` (under ``TORCHMUX_CACHE_DIR``), :func:`atomic_write`,
  :func:`debug_dir` (``TORCHMUX_DEBUG_DIR``); :func:`sign` and :func:`authentic` (HMAC-SHA256 under a
  per-user key): load an executable artifact only when ``authentic`` says so, else rebuild it.
"""

from __future__ import annotations

from .core.artifacts import (
    artifact_dir,
    atomic_write,
    authentic,
    debug_dir,
    load_claims,
    load_nonfinite_unsafe,
    sign,
)
from .core.backend import (
    Availability,
    Backend,
    CompiledGraph,
    CompileRequest,
    has_cuda,
    module_present,
    node_float_dtypes,
    package_version,
    version_tuple,
)
from .core.hookspecs import hookimpl
from .core.ir import GraphIR, TensorSpec, op_name, spec_of

__all__ = [
    "Availability", "Backend", "CompileRequest", "CompiledGraph", "GraphIR", "TensorSpec", "artifact_dir",
    "atomic_write", "authentic", "debug_dir", "has_cuda", "hookimpl", "load_claims", "load_nonfinite_unsafe", "module_present", "node_float_dtypes",
    "op_name", "package_version", "sign", "spec_of", "version_tuple",
]
