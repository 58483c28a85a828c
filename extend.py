"""The extension kit: everything a backend needs, and the only part of torchmux a backend imports.

torchmux's own backends are written with this module alone, exactly as a third-party plugin is
(a test parses their imports to keep it so); plugins.md documents it. Nothing here is private to
the built-ins.

- The contract: :class:`Backend`, :class:`Availability`, :class:`CompileRequest`,
  :class:`CompiledGraph` (:func:`kernel_count_of` reads its optional ``kernel_count``), :class:`Option`
  (one entry of ``Backend.options_schema``), :data:`CONTRACT_VERSION`, :data:`hookimpl` (hook
  specifications: ``torchmux.core.hookspecs``).
- The IR a backend is handed: :class:`GraphIR`, :class:`TensorSpec`, :func:`op_name` (the Core ATen
  name a claim is written in), :func:`spec_of`, :func:`node_float_dtypes`.
- Symbolic graphs: :func:`export_program` (``torch.export`` with one ``Dim`` per symbol, tensor
  inputs only: :func:`tensor_inputs`).
- Exported programs (``CompileRequest.program``, ``LoadRequest.program``): :func:`program_runner` (the
  program run eagerly on the flat tensor inputs), :func:`writes_in_place` (whether running it as it is
  may write the caller's inputs: copy them first).
- Claims: :func:`load_claims` reads the conformance suite's results (``python -m
  torchmux.testing.probe NAME --write claims.json``; before that file exists it returns an empty
  :class:`MissingClaims`, with a warning that says how to write it); :func:`load_nonfinite_unsafe` the ops in it that
  differ from eager on NaN/±inf inputs (set them as ``Backend.nonfinite_unsafe``).
- Environment probes that never import the library they ask about: :func:`package_version`,
  :func:`module_present`, :func:`version_tuple`, :func:`has_cuda`.
- CUDA: :func:`record_cuda_graph` (a compiled call recorded once and replayed as one CUDA graph, on
  static input buffers; ``core/cudagraph.py``).
- Artifacts: :func:`artifact_dir` (under ``TORCHMUX_CACHE_DIR``), :func:`atomic_write`, :func:`building`
  (held while this process builds into a folder: another process building the same artifact waits, then
  finds it built),
  :func:`debug_dir` (``TORCHMUX_DEBUG_DIR``); the fleet's shared cache (``TORCHMUX_REMOTE_CACHE``):
  :func:`fetch_artifact` (is the file here, locally or fetched from the remote cache?) and
  :func:`publish_artifact` (send a file just built), ``executable=True`` for shared libraries (they
  travel only signed with the fleet key);
  :func:`sign` and :func:`authentic` (HMAC-SHA256 under a
  per-user key): load an executable artifact only when ``authentic`` says so, else rebuild it.
"""

from __future__ import annotations

from .core.artifacts import (
    MissingClaims,
    artifact_dir,
    atomic_write,
    authentic,
    building,
    debug_dir,
    load_claims,
    load_nonfinite_unsafe,
    sign,
)
from .core.backend import (
    CONTRACT_VERSION,
    Availability,
    Backend,
    CompiledGraph,
    CompileRequest,
    LoadRequest,
    Option,
    SavedGraph,
    has_cuda,
    kernel_count_of,
    module_present,
    node_float_dtypes,
    package_version,
    version_tuple,
)
from .core.cudagraph import record as record_cuda_graph
from .core.hookspecs import hookimpl
from .core.ir import GraphIR, TensorSpec, op_name, spec_of
from .core.package import program_runner, writes_in_place
from .core.remote_cache import fetch_artifact, publish_artifact
from .core.symbolic import export_program, size_outputs, tensor_inputs

__all__ = [
    "CONTRACT_VERSION",
    "MissingClaims",
    "Availability",
    "Backend",
    "CompileRequest",
    "CompiledGraph",
    "GraphIR",
    "LoadRequest",
    "Option",
    "SavedGraph",
    "TensorSpec",
    "artifact_dir",
    "atomic_write",
    "building",
    "authentic",
    "debug_dir",
    "export_program",
    "fetch_artifact",
    "has_cuda",
    "hookimpl",
    "kernel_count_of",
    "load_claims",
    "load_nonfinite_unsafe",
    "module_present",
    "node_float_dtypes",
    "op_name",
    "package_version",
    "program_runner",
    "writes_in_place",
    "publish_artifact",
    "record_cuda_graph",
    "sign",
    "size_outputs",
    "spec_of",
    "tensor_inputs",
    "version_tuple",
]
