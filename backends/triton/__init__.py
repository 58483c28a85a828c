"""torchmux's own Triton fusion code generator (the cheap part: what it claims, where it runs).

Pointwise ops, broadcasts and reductions (sum, mean, amax, amin, var, argmax, prod, any, cumsum;
softmax, log_softmax, layer norm, group norm, and RMS norm as the pattern of those), padding,
concatenation, gathers (embedding, ``x[i]``, gather), pooling windows and inference batch norm are
grouped into fused kernels (fusion.py), written out as Triton source (codegen.py), compiled with
``triton.jit`` and launched (runtime.py). Matmuls and convolutions run as ATen calls between the
kernels. Nothing here imports triton: compile() does.

On a CPU the kernels run in Triton's interpreter when ``TRITON_INTERPRET=1`` was set before triton was
imported: exact and slow, for testing, so ``auto`` never picks this backend there.

Options: ``mode="max-autotune"`` or ``options={"triton.autotune": True}`` times a few block sizes per
kernel at compile time instead of trusting the heuristic.
"""
from __future__ import annotations

import os

import torch
import torch.fx as fx

import torchmux
from torchmux.core.backend import module_present, package_version, version_tuple

from .fusion import HANDLED_OPS, op_key

__all__ = ["TritonBackend", "torchmux_add_backends"]

MIN_VERSION = (3, 0)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(torchmux.Backend):
    name = "triton"
    package = "triton"
    description = "torchmux's Triton code generator: fuses pointwise ops and reductions, ATen for matmul/conv"
    # from `TRITON_INTERPRET=1 python tests/conformance/probe.py triton --dtype float32 --dtype float16 --dtype bfloat16`
    ops = frozenset({
        "aten.abs.default",
        "aten.neg.default",
        "aten.exp.default",
        "aten.expm1.default",
        "aten.log.default",
        "aten.log1p.default",
        "aten.sqrt.default",
        "aten.rsqrt.default",
        "aten.reciprocal.default",
        "aten.sin.default",
        "aten.cos.default",
        "aten.tanh.default",
        "aten.sigmoid.default",
        "aten.erf.default",
        "aten.relu.default",
        "aten.gelu.default",
        "aten.floor.default",
        "aten.ceil.default",
        "aten.round.default",
        "aten.sign.default",
        "aten.pow.Tensor_Scalar",
        "aten.clamp.default",
        "aten.leaky_relu.default",
        "aten.hardtanh.default",
        "aten.elu.default",
        "aten.add.Tensor",
        "aten.sub.Tensor",
        "aten.mul.Tensor",
        "aten.div.Tensor",
        "aten.maximum.default",
        "aten.minimum.default",
        "aten.pow.Tensor_Tensor",
        "aten.fmod.Tensor",
        "aten.eq.Tensor",
        "aten.ne.Tensor",
        "aten.gt.Tensor",
        "aten.lt.Tensor",
        "aten.le.Tensor",
        "aten.ge.Scalar",
        "aten.le.Scalar",
        "aten.logical_and.default",
        "aten.logical_not.default",
        "aten.where.self",
        "aten.scalar_tensor.default",
        "aten._to_copy.default",
        "aten.sum.dim_IntList",
        "aten.mean.dim",
        "aten.amax.default",
        "aten.amin.default",
        "aten.var.correction",
        "aten.argmax.default",
        "aten.prod.dim_int",
        "aten.cumsum.default",
        "aten.any.dim",
        "aten.mm.default",
        "aten.bmm.default",
        "aten.addmm.default",
        "aten.convolution.default",
        "aten.max_pool2d_with_indices.default",
        "aten.avg_pool2d.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten.native_layer_norm.default",
        "aten._softmax.default",
        "aten._log_softmax.default",
        "aten.native_group_norm.default",
        "aten.view.default",
        "aten.permute.default",
        "aten.expand.default",
        "aten.unsqueeze.default",
        "aten.squeeze.dims",
        "aten.cat.default",
        "aten.slice.Tensor",
        "aten.select.int",
        "aten.index.Tensor",
        "aten.gather.default",
        "aten.embedding.default",
        "aten.constant_pad_nd.default",
        "aten.clone.default",
        "aten.split_with_sizes.default",
        "aten.arange.start_step",
        "aten.full.default",
    })

    @property
    def devices(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cuda", "cpu") if _interpreting() else ("cuda",)

    @property
    def auto(self) -> bool:  # type: ignore[override]
        # the CPU interpreter is for testing: never chosen for speed
        return torch.cuda.is_available()

    def availability(self) -> torchmux.Availability:
        version = package_version("triton")
        if version is None or not module_present("triton"):
            return torchmux.Availability.no("triton is not installed; pip install 'torchmux[triton]' (triton>=3.0)")
        if version_tuple(version) < MIN_VERSION:
            return torchmux.Availability.no(f"triton {version} is too old; torchmux needs triton>=3.0 (pip install -U triton)")
        if not torch.cuda.is_available() and not _interpreting():
            return torchmux.Availability.no(
                "no CUDA GPU; set TRITON_INTERPRET=1 to run kernels in Triton's CPU interpreter (slow, for testing)"
            )
        return torchmux.Availability.yes()

    def supports(self, node: fx.Node) -> bool:
        # only ops the code generator lowers (or routes to ATen) ...
        if op_key(node) not in HANDLED_OPS and op_key(node) != "getitem":
            return False
        # ... and the claims and dtypes of the base class
        return super().supports(node)

    def compile(self, request: torchmux.CompileRequest) -> torchmux.CompiledGraph:
        from .runtime import compile_graph

        tune = request.mode in ("max-autotune", "max-autotune-no-cudagraphs") or bool(request.options.get("autotune"))
        return compile_graph(request.ir, request.example_inputs, autotune=tune)


@torchmux.hookimpl
def torchmux_add_backends() -> list[torchmux.Backend]:
    return [TritonBackend()]
