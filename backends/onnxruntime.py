"""ONNX Runtime: each graph becomes an ONNX model (torch's ONNX exporter) run by an InferenceSession.

This module is the cheap part: which distribution is installed, whether the exporter's dependencies
are there, and which execution providers can run here. The work (export, disk cache, sessions,
IOBinding) is in ``_onnxruntime_impl.py``, imported by :meth:`OnnxRuntimeBackend.compile`.

Options (``options={"onnxruntime.providers": [...]}``):

- ``providers``: ONNX Runtime execution providers, in priority order, as names or ``(name, options)``
  pairs. Default: ``["CPUExecutionProvider"]`` for CPU tensors; for CUDA tensors TensorRT (when its
  library is installed), then CUDA, then CPU.
- ``intra_op_num_threads``: threads per session (default: ONNX Runtime's, one per physical core).
"""

from __future__ import annotations

import ctypes.util
import functools

import torch

import torchmux
from torchmux.core.backend import module_present, package_version
from torchmux.core.ir import op_name, spec_of

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
_DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime")
_NEEDS = (("onnx", "onnx"), ("onnxscript", "onnxscript"))  # (module, distribution) torch's exporter needs


def installed_distribution() -> str:
    """The ONNX Runtime distribution that is installed (the GPU build first), or the CPU one's name."""
    return next((d for d in _DISTRIBUTIONS if package_version(d)), _DISTRIBUTIONS[-1])


@functools.lru_cache(maxsize=None)
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
        if TENSORRT in built and (ctypes.util.find_library("nvinfer") or module_present("tensorrt")):
            usable.append(TENSORRT)
        if CUDA in built:
            usable.append(CUDA)
    usable.append(CPU)
    return tuple(usable)


class OnnxRuntimeBackend(torchmux.Backend):
    name = "onnxruntime"
    devices = ("cpu", "cuda")
    package = installed_distribution()
    dtypes = (torch.float32, torch.float16)
    # From `python tests/conformance/probe.py onnxruntime` (float32 and float16, CPU): 81 of 81 pass in float32.
    ops = frozenset({
        "aten.abs.default", "aten.neg.default", "aten.exp.default", "aten.expm1.default", "aten.log.default",
        "aten.log1p.default", "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default",
        "aten.sin.default", "aten.cos.default", "aten.tanh.default", "aten.sigmoid.default", "aten.erf.default",
        "aten.relu.default", "aten.gelu.default", "aten.floor.default", "aten.ceil.default", "aten.round.default",
        "aten.sign.default", "aten.pow.Tensor_Scalar", "aten.clamp.default", "aten.leaky_relu.default",
        "aten.hardtanh.default", "aten.elu.default", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
        "aten.div.Tensor", "aten.maximum.default", "aten.minimum.default", "aten.pow.Tensor_Tensor",
        "aten.fmod.Tensor", "aten.eq.Tensor", "aten.ne.Tensor", "aten.gt.Tensor", "aten.lt.Tensor", "aten.ge.Scalar",
        "aten.le.Tensor", "aten.le.Scalar", "aten.scalar_tensor.default", "aten.logical_and.default", "aten.logical_not.default", "aten.where.self",
        "aten._to_copy.default", "aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default",
        "aten.var.correction", "aten.argmax.default", "aten.prod.dim_int", "aten.cumsum.default", "aten.any.dim",
        "aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.convolution.default",
        "aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default",
        "aten._native_batch_norm_legit_no_training.default", "aten.native_layer_norm.default",
        "aten._softmax.default", "aten._log_softmax.default", "aten.native_group_norm.default", "aten.view.default",
        "aten.permute.default", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dims",
        "aten.cat.default", "aten.slice.Tensor", "aten.select.int", "aten.index.Tensor", "aten.gather.default",
        "aten.embedding.default", "aten.constant_pad_nd.default", "aten.clone.default",
        "aten.split_with_sizes.default", "aten.arange.start_step", "aten.full.default",
    })
    # In float16 the probe saw these fail (before supports() rejected them): torch's exporter computes
    # them in float32 and returns the float32 value, leaving the cast back dangling, or its layer/batch
    # norm returns float32 statistics. compile() catches such type changes anyway (it checks every
    # input and output type of the model against the graph) and refuses.
    float16_broken = frozenset({
        "aten.abs.default", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.prod.dim_int",
        "aten.cumsum.default", "aten._native_batch_norm_legit_no_training.default", "aten.native_layer_norm.default",
    })

    @property
    def description(self) -> str:  # type: ignore[override]
        text = "ONNX model (torch.onnx exporter) in an ONNX Runtime session, IOBinding on torch memory"
        if not self.availability().ok:
            return text
        return f"{text}; providers usable here: {', '.join(usable_providers())}"

    def availability(self) -> torchmux.Availability:
        if not module_present("onnxruntime"):
            return torchmux.Availability.no(
                "onnxruntime is not installed; pip install onnxruntime (CPU) or onnxruntime-gpu (CUDA, TensorRT)"
            )
        missing = [dist for module, dist in _NEEDS if not module_present(module)]
        if missing:
            return torchmux.Availability.no(
                f"torch's ONNX exporter needs {', '.join(missing)}, which is not installed; pip install {' '.join(missing)}"
            )
        try:
            usable_providers()
        except Exception as e:  # a broken install (missing shared library) imports with an error
            return torchmux.Availability.no(f"onnxruntime is installed but fails to import: {type(e).__name__}: {e}")
        return torchmux.Availability.yes()

    def supports(self, node: torch.fx.Node) -> bool:
        values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        for v in values:
            for t in v if isinstance(v, (tuple, list)) else [v]:
                spec = spec_of(t)
                # a session has static shapes: symbolic dimensions are left to other backends
                if spec is not None and not spec.is_static:
                    return False
                # IOBinding describes memory with NumPy's element types: none for bfloat16 or complex
                if spec is not None and (spec.dtype == torch.bfloat16 or spec.dtype.is_complex):
                    return False
                # float16 cases the conformance suite sees fail (see float16_broken)
                if spec is not None and spec.dtype == torch.float16 and op_name(node) in self.float16_broken:
                    return False
        return super().supports(node)

    def compile(self, request: torchmux.CompileRequest) -> torchmux.CompiledGraph:
        from . import _onnxruntime_impl

        return _onnxruntime_impl.compile_graph(request)


@torchmux.hookimpl
def torchmux_add_backends() -> list[torchmux.Backend]:
    return [OnnxRuntimeBackend()]
