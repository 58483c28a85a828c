"""torchmux's own Triton fusion code generator (the cheap part: what it claims, where it runs).

Pointwise ops, broadcasts and reductions (sum, mean, amax, amin, var, argmax, prod, any, cumsum;
softmax, log_softmax, layer norm, group norm, and RMS norm as the pattern of those), padding,
concatenation, gathers (embedding, ``x[i]``, gather), pooling windows and inference batch norm are
grouped into fused kernels (fusion.py), written out as Triton source (codegen.py), compiled with
``triton.jit`` and launched (runtime.py). Matmuls and convolutions run as ATen calls between the
kernels. Nothing here imports triton: compile() does.

On a CPU the kernels run in Triton's interpreter when ``TRITON_INTERPRET=1`` was set before triton was
imported: exact and slow, for testing, so ``auto`` never picks this backend there.

Options (:data:`OPTIONS`): ``mode="max-autotune"`` or ``options={"triton.autotune": True}`` times a
few block sizes per kernel at compile time instead of trusting the heuristic.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.fx as fx

from torchmux import extend
from torchmux.extend import load_claims, load_nonfinite_unsafe, module_present, package_version, version_tuple

from .fusion import HANDLED_OPS, op_key

__all__ = ["TritonBackend", "torchmux_add_backends"]

MIN_VERSION = (3, 0)

OPTIONS = {
    "autotune": extend.Option(
        bool,
        False,
        "time a few block sizes per kernel at compile time instead of trusting "
        "the heuristic (on by default under mode='max-autotune')",
    ),
}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class TritonBackend(extend.Backend):
    name = "triton"
    package = "triton"
    description = "torchmux's Triton code generator: fuses pointwise ops and reductions, ATen for matmul/conv"
    # what the conformance suite passed (`TRITON_INTERPRET=1 python -m torchmux.testing.probe triton
    # --dtype float32 --dtype float16 --dtype bfloat16 --write ...`); supports() also asks the code
    # generator's own table (fusion.HANDLED_OPS)
    claims = load_claims(Path(__file__).with_name("claims.json"))
    nonfinite_unsafe = load_nonfinite_unsafe(Path(__file__).with_name("claims.json"))
    contract_version = extend.CONTRACT_VERSION
    options_schema = OPTIONS
    # kernels take symbolic sizes as arguments (masks, grids and blocks from each call's sizes): one
    # compile of a symbolic graph serves every size (runtime.py, "Symbolic graphs")
    dynamic_shapes = True

    @property
    def devices(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("cuda", "cpu") if _interpreting() else ("cuda",)

    @property
    def auto(self) -> bool:  # type: ignore[override]
        # the CPU interpreter is for testing: never chosen for speed
        return torch.cuda.is_available()

    def availability(self) -> extend.Availability:
        version = package_version("triton")
        if version is None or not module_present("triton"):
            return extend.Availability.no("triton is not installed; pip install 'torchmux[triton]' (triton>=3.0)")
        if version_tuple(version) < MIN_VERSION:
            return extend.Availability.no(
                f"triton {version} is too old; torchmux needs triton>=3.0 (pip install -U triton)"
            )
        if not torch.cuda.is_available() and not _interpreting():
            return extend.Availability.no(
                "no CUDA GPU; set TRITON_INTERPRET=1 to run kernels in Triton's CPU interpreter (slow, for testing)"
            )
        return extend.Availability.yes()

    def supports(self, node: fx.Node) -> bool:
        # only ops the code generator lowers (or routes to ATen) ...
        if op_key(node) not in HANDLED_OPS and op_key(node) != "getitem":
            return False
        # ... and the claims and dtypes of the base class
        return super().supports(node)

    def compile(self, request: extend.CompileRequest) -> extend.CompiledGraph:
        from .runtime import compile_graph

        tune = request.mode in ("max-autotune", "max-autotune-no-cudagraphs") or bool(request.options.get("autotune"))
        return compile_graph(request.ir, request.example_inputs, autotune=tune)


@extend.hookimpl
def torchmux_add_backends() -> list[extend.Backend]:
    return [TritonBackend()]
