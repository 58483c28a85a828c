"""ONNX Runtime backend, step 3: a GraphIR becomes an ONNX model (torch's exporter, torchlib).

``export_onnx`` runs on a cache miss only (session.py keeps the files). ``torch.export`` the ATen
graph module, then translate it with torch's ONNX exporter (torchlib), opset 20. Two rewrites follow:
an output that passes an input through gets an Identity (ONNX Runtime leaves the buffer bound to such
an output unwritten), and the weight Transpose in front of a Gemm becomes ``transB`` (a weight input
would otherwise be transposed on every call).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchmux.extend import GraphIR, export_program, size_outputs, tensor_inputs

EXPORT_FORMAT = 4  # bump whenever export_onnx changes what it writes: old cache entries then miss
# 20 is the first opset with a Gelu op; at 18 (torchlib's default) GELU is five elementwise ops
OPSET = 20
IR_VERSION = 10  # torch's exporter writes 10; ONNX Runtime 1.31 reads up to 13 (onnx 1.23 alone would write 14)

_registry_lock = threading.Lock()
_registry: Any = None


def _onnx_registry() -> Any:
    """torchlib's ATen -> ONNX translations, built once per process (it takes about a second)."""
    global _registry
    with _registry_lock:
        if _registry is None:
            from torch.onnx._internal.exporter import _registration

            quiet = logging.getLogger(_registration.__name__)
            level = quiet.level
            quiet.setLevel(logging.ERROR)  # it warns about every torchvision op when torchvision is absent
            try:
                _registry = _registration.ONNXRegistry.from_torchlib(opset_version=OPSET)
            finally:
                quiet.setLevel(level)
        return _registry


def export_onnx(ir: GraphIR, example_inputs: Sequence[Any]) -> bytes:
    """The ONNX model of ``ir`` (serialized), inputs and outputs in the graph's order.

    The graph is already Core ATen, so the fast path translates it directly with torchlib (tens of
    milliseconds); if that fails, the public ``torch.onnx.export`` (which first decomposes further
    with ONNX's own table, about a second more) gets a second try.
    """
    args = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in example_inputs)
    try:
        program = _export_fast(ir, args)
    except Exception as fast_error:
        try:
            exported = export_program(ir, args)
            _squeeze_only_ones_fx(exported.graph_module)
            program = torch.onnx.export(
                exported,
                (),
                dynamo=True,
                optimize=False,
                verify=False,
                report=False,
                verbose=False,
                opset_version=OPSET,
            )
        except Exception as e:
            raise RuntimeError(
                f"torch's ONNX exporter cannot translate graph {ir.name}: {type(e).__name__}: {first_line(e)} "
                f"(direct translation failed first with {type(fast_error).__name__}: {first_line(fast_error)})"
            ) from e
    model = program.model_proto
    tensors = len(tensor_outputs(ir))
    if len(model.graph.input) != len(tensor_inputs(ir)) or len(model.graph.output) != tensors:
        raise RuntimeError(
            f"the ONNX model of graph {ir.name} has {len(model.graph.input)} inputs and {len(model.graph.output)} "
            f"outputs; the graph has {len(ir.placeholders)} inputs and {tensors} tensor outputs"
        )
    _outputs_not_inputs(model)
    _transposes_into_gemm(model)
    # the direct translation writes torchlib's default opset (18) into the model whatever the registry's
    # opset was; both paths translated for OPSET
    for op in list(model.opset_import):
        if op.domain in ("", "ai.onnx"):
            model.opset_import.remove(op)
    model.opset_import.add(domain="", version=OPSET)
    model.ir_version = min(model.ir_version, IR_VERSION)
    return model.SerializeToString()


def export_program_onnx(program: Any) -> bytes:
    """The ONNX model of a whole exported program (``torchmux.export``), as ONNX Runtime's users make it:
    ``torch.onnx.export(program, dynamo=True)`` on the program before Core ATen decomposition, so torch's
    exporter keeps what ONNX has ops for (``BatchNormalization``, ``Gelu``, attention patterns), then
    the optimizer ``optimize=True`` runs (onnxscript's ``optimize_ir`` and ``onnx_fusions.fuse``) with
    one difference: it folds no node that reads one of the program's weights. The weights stay
    initializers under the program's own names, which lets a package store them once
    (:func:`weights_by_reference`); ONNX Runtime folds those nodes (a weight's transpose) itself when the
    session opens (measured: the same speed on tiny BERT). A dimension the program declared dynamic
    is a symbolic ONNX dimension. Inputs and outputs are the program's flattened ones."""
    import onnxscript
    from onnx_ir import serde

    onnx_program = torch.onnx.export(
        program, (), dynamo=True, optimize=False, verify=False, report=False, verbose=False
    )
    if onnx_program is None:  # dynamo=True always returns the program; None only from the legacy exporter
        raise RuntimeError("torch.onnx.export returned no ONNX program")
    _squeeze_only_ones(onnx_program.model.graph)
    weights = set(program.state_dict) | set(program.constants)

    def keep_weights(node: Any) -> bool | None:
        reads = any(v is not None and v.is_initializer() and v.name in weights for v in node.inputs)
        return False if reads else None  # None: the optimizer's own rule decides

    onnxscript.optimizer.optimize_ir(onnx_program.model, should_fold=keep_weights)
    onnxscript.rewriter.onnx_fusions.fuse(onnx_program.model)
    model = serde.serialize_model(onnx_program.model)
    _outputs_not_inputs(model)
    model.ir_version = min(model.ir_version, IR_VERSION)
    return model.SerializeToString()


def _squeeze_only_ones_fx(gm: torch.fx.GraphModule) -> None:
    """The Core ATen form of :func:`_squeeze_only_ones`, on a program made for one export (``compile()``'s
    path): ``aten.squeeze.dims`` left with the dimensions of size 1 or unknown; with none left, an
    ``aten.alias`` (torch's ONNX translation of ``squeeze.dims`` refuses a dimension that is not 1)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.squeeze.dims:
            continue
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            continue
        given = [int(d) % val.dim() for d in node.args[1]]
        kept = [d for d in given if not (isinstance(val.shape[d], int) and val.shape[d] != 1)]
        if kept == given:
            continue
        if kept:
            node.args = (x, kept)
        else:
            node.target, node.args = torch.ops.aten.alias.default, (x,)
    gm.recompile()


def _squeeze_only_ones(graph: Any) -> None:
    """Each ``Squeeze`` in ``graph`` (an ``onnx_ir`` graph) left with the axes whose size is 1 or unknown.
    torch's ``x.squeeze(2)`` does nothing where that dimension is not 1; torch's ONNX exporter writes a
    ``Squeeze`` of axis 2 anyway, which ONNX Runtime refuses to load ("Dimension of input 2 must be 1
    instead of 4"; an attention module of two ParityBench samples, and the model ``torch.onnx.export``
    writes for it used directly). A Squeeze with no axis left becomes an ``Identity``."""
    import numpy as np
    import onnx_ir as ir

    for node in list(graph):
        if node.op_type != "Squeeze" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        x, axes = node.inputs[0], node.inputs[1]
        found = ir.convenience.get_const_tensor(axes) if axes is not None else None
        shape = x.shape if x is not None else None
        if found is None or shape is None or len(shape) == 0:
            continue
        given = [int(a) % len(shape) for a in found.numpy().reshape(-1)]
        kept = [a for a in given if not (isinstance(shape[a], int) and shape[a] != 1)]
        if kept == given:
            continue
        if kept:
            const = ir.Value(name=f"{node.name}_axes_of_size_1", const_value=ir.tensor(np.array(kept, np.int64)))
            graph.register_initializer(const)
            node.replace_input_with(1, const)
        else:
            node.op_type = "Identity"
            node.resize_inputs(1)


#: the ``location`` an initializer stored by reference names (no file: the loader supplies the array)
BY_REFERENCE = "torchmux:program-weight"


def weights_by_reference(
    data: bytes, weights: Mapping[str, Any], transposed: dict[str, str] | None = None
) -> tuple[bytes, dict[str, str]]:
    """The model ``data`` with each initializer that holds one of ``weights`` (name -> CPU tensor) byte
    for byte turned into a reference (external data at :data:`BY_REFERENCE`, no bytes), and the map
    initializer -> weight name. A package stores the program's weights once, in the program; the loader
    hands ONNX Runtime those arrays (``SessionOptions.add_external_initializers``, no copy).
    ``transposed``: also an initializer that is a 2-D weight transposed (ONNX Runtime's optimizer folds
    a weight's ``Transpose`` into one), recorded there (initializer -> weight name); the loader hands
    over the weight transposed (one copy)."""
    import hashlib

    import onnx

    def key(dtype: Any, dims: Sequence[int], raw: bytes) -> tuple[Any, ...]:
        return (dtype, tuple(dims), hashlib.sha256(raw).digest())

    index: dict[tuple[Any, ...], str] = {}
    flipped: dict[tuple[Any, ...], str] = {}
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            continue
        try:
            array = t.detach().contiguous().numpy()
        except TypeError:  # a dtype NumPy cannot hold (bfloat16): the model keeps that initializer itself
            continue
        dtype = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        index.setdefault(key(dtype, t.shape, array.tobytes()), name)
        if transposed is not None and array.ndim == 2:
            flipped.setdefault(key(dtype, t.shape[::-1], array.T.tobytes()), name)
    model = onnx.load_from_string(data)
    refs: dict[str, str] = {}
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or not init.raw_data:
            continue
        k = key(init.data_type, init.dims, init.raw_data)
        if k in index:
            refs[init.name] = index[k]
        elif transposed is not None and k in flipped:
            transposed[init.name] = flipped[k]
        else:
            continue
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        del init.external_data[:]
        entry = init.external_data.add()
        entry.key, entry.value = "location", BY_REFERENCE
    return (model.SerializeToString() if refs or transposed else data), refs


def _transposes_into_gemm(model: Any) -> None:
    """``F.linear`` arrives as ``addmm(b, x, permute(w, [1, 0]))``: Transpose then Gemm. A weight is a graph
    input (not a constant), so ONNX Runtime would transpose it on every call; Gemm's ``transB`` reads it
    transposed for free. Fold every 2-D Transpose that feeds a Gemm operand into that flag."""
    import onnx

    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output}
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx"):
            continue
        for index, flag in ((0, "transA"), (1, "transB")):
            src = producer.get(node.input[index])
            perm = next((list(a.ints) for a in src.attribute if a.name == "perm"), None) if src is not None else None
            if src is None or src.op_type != "Transpose" or src.domain not in ("", "ai.onnx") or perm != [1, 0]:
                continue
            attrs = {a.name: a for a in node.attribute}
            value = 1 - (attrs[flag].i if flag in attrs else 0)
            if flag in attrs:
                node.attribute.remove(attrs[flag])
            node.attribute.append(onnx.helper.make_attribute(flag, value))
            node.input[index] = src.input[0]
    used = {i for n in graph.node for i in n.input} | outputs
    dead = [n for n in graph.node if n.op_type == "Transpose" and not any(o in used for o in n.output)]
    for n in dead:
        graph.node.remove(n)


def _outputs_not_inputs(model: Any) -> None:
    """Give every output that is a graph input its own value (an Identity): ONNX Runtime does not write
    a passed-through input into the output buffer bound for it."""
    import onnx

    inputs = {i.name for i in model.graph.input}
    for i, out in enumerate(model.graph.output):
        if out.name in inputs:
            new = f"{out.name}__output{i}"
            model.graph.node.append(onnx.helper.make_node("Identity", [out.name], [new], name=f"passthrough_{i}"))
            out.name = new


def _export_fast(ir: GraphIR, args: tuple[Any, ...]) -> Any:
    from torch.onnx._internal.exporter import _core, _fx_passes

    registry = _onnx_registry()
    program = export_program(ir, args)
    _squeeze_only_ones_fx(program.graph_module)
    _fx_passes.insert_type_promotion_nodes(program.graph_module)  # ONNX has no implicit type promotion
    return _core._exported_program_to_onnx_program(program, registry=registry)


def tensor_outputs(ir: GraphIR) -> list[int]:
    """Positions of the graph's tensor outputs; the others are None (a backward graph's gradient of an
    input that needs none), which the ONNX model leaves out and the compiled graph returns as None."""
    positions = []
    sizes = size_outputs(ir)
    for i, out in enumerate(ir.outputs):
        if out is None or i in sizes:  # a size (symbolic graphs) is computed from the call's sizes
            continue
        if not isinstance(out, torch.fx.Node):
            raise NotImplementedError(f"graph {ir.name} returns {out!r} (output {i}); onnxruntime returns tensors only")
        positions.append(i)
    return positions


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""
