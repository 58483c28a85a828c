"""ONNX Runtime: each graph becomes an ONNX model (torch's ONNX exporter) run by an InferenceSession.

This module is the cheap part: which distribution is installed, whether the exporter's dependencies
are there, and which execution providers can run here. The work (export, disk cache, sessions,
IOBinding) is in ``_onnxruntime_impl.py``, imported by :meth:`OnnxRuntimeBackend.compile`.

Options (``options={"onnxruntime.<name>": value}``): :data:`OPTIONS` below, checked when
``compile()`` is called.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from torchmux import extend
from torchmux.extend import load_claims, load_nonfinite_unsafe, module_present, package_version, spec_of

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
_DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime")
_NEEDS = (("onnx", "onnx"), ("onnxscript", "onnxscript"))  # (module, distribution) torch's exporter needs

OPTIONS: dict[str, extend.Option] = {
    "providers": extend.Option(
        (list, tuple),
        None,
        "ONNX Runtime execution providers in priority order, as names or (name, options) "
        "pairs (default: CPU for CPU tensors; TensorRT when its library is installed, then CUDA, then CPU for CUDA)",
    ),
    "intra_op_num_threads": extend.Option(
        int, None, "threads per session (default: torch.get_num_threads(), as torch.set_num_threads set it)"
    ),
    "allow_spinning": extend.Option(
        bool,
        False,
        "let a session's threads spin between the parallel sections of a run (they stop when it returns "
        "either way; off: a sleeping thread is woken for each section, which costs less on a busy machine)",
    ),
}


@functools.cache
def installed_distribution() -> str:
    """The ONNX Runtime distribution that is installed (the GPU build first), or the CPU one's name (read
    from the installed metadata, ~5 ms: on first use, not at import, which a package's load waits for)."""
    return next((d for d in _DISTRIBUTIONS if package_version(d)), _DISTRIBUTIONS[-1])


@functools.cache
def built_providers() -> tuple[str, ...]:
    """The execution providers this onnxruntime build contains (none when it is missing or fails to import)."""
    try:
        import onnxruntime as ort  # cheap (~0.2 s); only when asked, never at import
    except Exception:
        return ()
    return tuple(ort.get_available_providers())


@functools.cache
def usable_providers() -> tuple[str, ...]:
    """The execution providers that can run here, best first.

    ``onnxruntime.get_available_providers()`` lists the providers the build contains, including CUDA and
    TensorRT in the GPU build on a machine without a GPU; a GPU provider is usable only when torch sees
    a CUDA device too (and, for TensorRT, when libnvinfer can be found).
    """
    import onnxruntime as ort  # cheap (~0.2 s); only when asked, never at import

    built = set(ort.get_available_providers())
    usable = []
    if torch.cuda.is_available():
        import ctypes.util

        if TENSORRT in built and (ctypes.util.find_library("nvinfer") or module_present("tensorrt")):
            usable.append(TENSORRT)
        if CUDA in built:
            usable.append(CUDA)
    usable.append(CPU)
    return tuple(usable)


class OnnxRuntimeBackend(extend.Backend):
    name = "onnxruntime"
    dynamic_shapes = True  # dynamic axes: one session serves every size of a symbolic graph
    devices = ("cpu", "cuda")
    dtypes = (torch.float32, torch.float16)
    # what the conformance suite passed, per dtype (`python -m torchmux.testing.probe onnxruntime
    # --dtype float32 --dtype float16 --write ...`). In float16 torch's exporter computes a few ops in
    # float32 (their cast back dangles, or layer/batch norm returns float32 statistics): not claimed.
    claims = load_claims(Path(__file__).with_name("claims.json"))
    contract_version = extend.CONTRACT_VERSION
    exports_programs = True  # torchmux.export: AOTInductor / torch.onnx.export of the whole program
    options_schema = OPTIONS
    nonfinite_unsafe = load_nonfinite_unsafe(Path(__file__).with_name("claims.json"))

    @property
    def package(self) -> str:  # type: ignore[override]
        return installed_distribution()

    @property
    def description(self) -> str:  # type: ignore[override]
        text = "ONNX model (torch.onnx exporter) in an ONNX Runtime session, IOBinding on torch memory"
        if not self.availability().ok:
            return text
        return f"{text}; providers usable here: {', '.join(usable_providers())}"

    def supports_device(self, device: str) -> bool:
        """CUDA tensors need a GPU provider in the build: the CPU-only ``onnxruntime`` wheel has none, and
        binding a CUDA tensor to its session fails on every call."""
        if device == "cuda":
            return CUDA in built_providers() or TENSORRT in built_providers()
        return super().supports_device(device)

    def availability(self) -> extend.Availability:
        if not module_present("onnxruntime"):
            return extend.Availability.no(
                "onnxruntime is not installed; pip install onnxruntime (CPU) or onnxruntime-gpu (CUDA, TensorRT)"
            )
        missing = [dist for module, dist in _NEEDS if not module_present(module)]
        if missing:
            return extend.Availability.no(
                f"torch's ONNX exporter needs {', '.join(missing)}, which is not installed; pip install {' '.join(missing)}"
            )
        try:
            usable_providers()
        except Exception as e:  # a broken install (missing shared library) imports with an error
            return extend.Availability.no(f"onnxruntime is installed but fails to import: {type(e).__name__}: {e}")
        return extend.Availability.yes()

    def supports(self, node: torch.fx.Node) -> bool:
        values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        for v in values:
            for t in v if isinstance(v, (tuple, list)) else [v]:
                spec = spec_of(t)
                # IOBinding describes memory with NumPy's element types: none for bfloat16 or complex
                if spec is not None and (spec.dtype == torch.bfloat16 or spec.dtype.is_complex):
                    return False
        return super().supports(node)

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        from . import session

        return session.compile_graph(request)

    def save(self, compiled: extend.CompiledGraph, request: extend.CompileRequest) -> extend.SavedGraph | None:
        from . import session

        return session.save_graph(compiled, request.program) if isinstance(compiled, session.OrtGraph) else None

    def load(self, request: extend.LoadRequest) -> extend.CompiledGraph:
        from . import session

        return session.load_graph(request)


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [OnnxRuntimeBackend()]
