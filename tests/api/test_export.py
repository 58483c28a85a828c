"""torchmux.export -> save -> torchmux.load in a fresh process: real torch.export, ONNX Runtime sessions,
AOTInductor packages, and the package's checks (a flipped byte, a truncated file, a planted library,
inputs outside the declared range, a weight swap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import torchmux
from torchmux import extend
from torchmux.api.load import PackageInputError
from torchmux.bench import zoo
from torchmux.core.errors import BadArgumentError
from torchmux.core.package import PT2_DTYPES, PackageError, PackageReader, numpy_weights, program_weights
from torchmux.core.registry import get_registry

Dim = torch.export.Dim

# the child: load the package, call it on the stored inputs, report what ran, what it warned, the error
# against the stored answer, and whether Dynamo counted anything across the load and 100 calls
CHILD = textwrap.dedent(
    """
    import json, sys, warnings, copy
    {preamble}
    import torch
    import torchmux
    from torchmux.bench import zoo

    path, data = sys.argv[1], sys.argv[2]
    d = torch.load(data, weights_only=True)
    before = copy.deepcopy(dict(torch._dynamo.utils.counters))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = torchmux.load(path)
        plugins = sorted(n for n in sys.modules if n.startswith("torchmux.backends."))
        with torch.no_grad():
            out = m(*d["inputs"])
            for _ in range(100):
                m(*d["inputs"])
    after = dict(torch._dynamo.utils.counters)
    err = max(float((a - b).abs().max()) for a, b in zip(zoo.tensors_of(out), d["expected"]))
    print(json.dumps({{
        "backend": m.backend,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning)],
        "err": err,
        "dynamo_unchanged": before == after,
        "plugins": plugins,
        "tuner": "torchmux.autotune.tuner" in sys.modules,
    }}))
    """
)


def _load_in_child(path: Path, inputs: tuple, expected: list, *, preamble: str = "", env: dict | None = None) -> dict:
    data = path.with_suffix(".data")
    torch.save({"inputs": list(inputs), "expected": [t.detach() for t in expected]}, data)
    script = CHILD.format(preamble=preamble)
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), str(data)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _eager(model: nn.Module, *args: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return zoo.tensors_of(model(*args))


@pytest.fixture(scope="module")
def mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return zoo.build("mlp", 4)


@pytest.fixture(scope="module")
def mlp_ort(mlp, tmp_path_factory) -> Path:
    model, args = mlp
    exported = torchmux.export(model, args, backend="onnxruntime", dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    assert exported.backend == "onnxruntime"
    return exported.save(tmp_path_factory.mktemp("pkg") / "mlp.tmux")


def test_mlp_onnxruntime_in_a_fresh_process_at_another_batch_size(mlp, mlp_ort) -> None:
    model, _ = mlp
    x = torch.randn(7, 256)  # not the example's batch size: the ONNX model's batch dimension is symbolic
    result = _load_in_child(mlp_ort, (x,), _eager(model, x))
    assert result["backend"] == "onnxruntime" and result["warnings"] == []
    assert result["err"] < 1e-4
    assert result["dynamo_unchanged"]  # no Dynamo frame, no guard, across the load and 100 calls
    # the one plugin that provides the stored backend is imported, not every installed one, nor the tuner
    assert {p.split(".")[2] for p in result["plugins"]} == {"onnxruntime"} and not result["tuner"]


def test_package_members_and_inspect(mlp_ort) -> None:
    reader = PackageReader(mlp_ort)
    assert reader.names() == [
        "artifacts/onnxruntime/meta.json",
        "artifacts/onnxruntime/model.onnx",
        "artifacts/onnxruntime/model.opt.onnx",  # as ONNX Runtime optimized it at export
        "plan.json",
        "program.pt2",
    ]
    assert reader.manifest["torch"] == torch.__version__ and reader.manifest["backends"]["onnxruntime"]
    # eager always works: the program inside is torch.export's own format
    import io

    program = torch.export.load(io.BytesIO(reader.read("program.pt2")))
    assert isinstance(program, torch.export.ExportedProgram)
    # the weights once: the ONNX model refers to the program's weights instead of holding them ...
    import onnx

    model = onnx.load_from_string(reader.read("artifacts/onnxruntime/model.onnx"))
    refs = reader.json("artifacts/onnxruntime/meta.json")["weights"]
    weights = {**program.state_dict, **program.constants}
    assert refs and set(refs.values()) == set(weights)
    held = sum(len(i.raw_data) for i in model.graph.initializer)
    assert held < sum(t.numel() * t.element_size() for t in weights.values()) / 100
    optimized = onnx.load_from_string(reader.read("artifacts/onnxruntime/model.opt.onnx"))
    assert sum(len(i.raw_data) for i in optimized.graph.initializer) <= held
    # ... and the package reads them back from the program's archive, equal, without deserializing it
    arrays = program_weights(reader.read("program.pt2"))
    assert arrays is not None and set(arrays) == set(weights)
    assert all(torch.equal(torch.from_numpy(arrays[k].copy()), v.detach()) for k, v in weights.items())
    out = subprocess.run(
        [sys.executable, "-m", "torchmux", "package", "inspect", str(mlp_ort)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "chosen: onnxruntime" in out.stdout and "(batch) in [1, 32]" in out.stdout  # the user's Dim name
    isa = reader.manifest["machine"].get("isa")  # what native code built here may need of a CPU
    assert isa is None or f"CPU extensions {len(isa)}" in out.stdout, out.stdout


def test_program_weights_reads_torch_exports_dtype_numbers() -> None:
    """The package reads program.pt2's weights by torch.export's serialized dtype numbers: they must be torch's."""
    from torch._export.serde.serialize import _TORCH_TO_SERIALIZE_DTYPE

    ours = {number: name for number, name in PT2_DTYPES.items()}
    theirs = {v.value: str(k).removeprefix("torch.") for k, v in _TORCH_TO_SERIALIZE_DTYPE.items()}
    assert all(theirs[n] == name for n, name in ours.items())
    m = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5)).eval()  # float weights, an int64 buffer
    program = torch.export.export(m, (torch.randn(3, 6),))
    import io

    buf = io.BytesIO()
    torch.export.save(program, buf)
    arrays = program_weights(buf.getvalue())
    assert arrays is not None and arrays["1.num_batches_tracked"].dtype.name == "int64"
    assert all(torch.equal(torch.from_numpy(arrays[k].copy()), v.detach()) for k, v in program.state_dict.items())
    assert set(numpy_weights(program)) == set(arrays)  # the same, from a program in memory
    # bfloat16, which NumPy cannot hold: the archive is not taken apart, and no array is made of it
    bf = torch.export.export(nn.Linear(2, 2).to(torch.bfloat16).eval(), (torch.randn(1, 2, dtype=torch.bfloat16),))
    buf = io.BytesIO()
    torch.export.save(bf, buf)
    assert program_weights(buf.getvalue()) is None and numpy_weights(bf) == {}


def test_loads_where_onnxruntime_cannot_be_imported(mlp, mlp_ort) -> None:
    model, args = mlp
    result = _load_in_child(
        mlp_ort, args, _eager(model, *args), preamble="sys.modules['onnxruntime'] = None  # import fails"
    )
    assert result["backend"] == "eager"
    assert len(result["warnings"]) == 1 and "onnxruntime" in result["warnings"][0]
    assert result["err"] < 1e-5


def test_inputs_are_checked_against_the_declared_range(mlp, mlp_ort) -> None:
    m = torchmux.load(mlp_ort)
    with pytest.raises(PackageInputError, match=r"input 0 dimension 0 \(batch\) must be in \[1, 32\].*got 33"):
        m(torch.randn(33, 256))
    with pytest.raises(PackageInputError, match="dimension 1 must be 256"):
        m(torch.randn(2, 255))
    with pytest.raises(PackageInputError, match="must be float32"):
        m(torch.randn(2, 256, dtype=torch.float64))
    with pytest.raises(PackageInputError, match="takes 1 input"):
        m(torch.randn(2, 256), torch.randn(2, 256))
    with pytest.raises(PackageInputError, match="inference only"):
        m(torch.randn(2, 256, requires_grad=True))


def test_the_quick_input_check_refuses_what_the_full_one_names(tmp_path) -> None:
    """The per-call check reads each input once (dtype, device, size, requires_grad) and hands anything
    it does not pass to the full check, which names the fault: a symbol shared by two inputs must be
    equal in both, a static dimension of a dynamic input holds, a tensor subclass is still a tensor."""

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + y

    batch = Dim("batch", min=1, max=16)
    model, args = Two().eval(), (torch.randn(3, 8), torch.randn(3, 4))
    m = torchmux.load(
        torchmux.export(model, args, backend="eager", dynamic_shapes=({0: batch}, {0: batch})).save(
            tmp_path / "two.tmux"
        )
    )
    with torch.no_grad():
        x = torch.randn(5, 8)
        torch.testing.assert_close(m(x, torch.ones(5, 4)), model(x, torch.ones(5, 4)))
        torch.testing.assert_close(
            m(nn.Parameter(x, requires_grad=False), torch.ones(5, 4)), model(x, torch.ones(5, 4))
        )
        with pytest.raises(PackageInputError, match="dimension 0 is batch, which another input has as 5; got 6"):
            m(x, torch.ones(6, 4))
        with pytest.raises(PackageInputError, match="input 1 dimension 1 must be 4"):
            m(x, torch.ones(5, 3))
        with pytest.raises(PackageInputError, match="input 0 must be a tensor"):
            m(x.numpy(), torch.ones(5, 4))
        with pytest.raises(PackageInputError, match="3 dimensions|2 dimensions"):
            m(x[None], torch.ones(5, 4))
    static = torchmux.load(torchmux.export(model, args, backend="eager").save(tmp_path / "static.tmux"))
    with torch.no_grad():
        torch.testing.assert_close(static(*args), model(*args))
        with pytest.raises(PackageInputError, match="input 0 dimension 0 must be 3 .*exported static.*got 4"):
            static(torch.randn(4, 8), torch.randn(3, 4))


def test_damaged_and_foreign_files_are_clear_errors(mlp_ort, tmp_path) -> None:
    data = bytearray(mlp_ort.read_bytes())
    info = zipfile.ZipFile(mlp_ort).getinfo("artifacts/onnxruntime/model.onnx")
    flipped = tmp_path / "flipped.tmux"
    data[info.header_offset + 200] ^= 0xFF  # inside the stored ONNX model
    flipped.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="model.onnx is damaged or altered"):
        torchmux.load(flipped)
    truncated = tmp_path / "truncated.tmux"
    truncated.write_bytes(mlp_ort.read_bytes()[: len(data) // 2])
    with pytest.raises(PackageError, match="not a torchmux package|damaged or altered"):
        torchmux.load(truncated)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as z:
        z.writestr("hello.txt", "not a package")
    with pytest.raises(PackageError, match="no manifest.json"):
        torchmux.load(foreign)


def test_weights_swap_without_exporting_again(mlp, mlp_ort) -> None:
    model, args = mlp
    m = torchmux.load(mlp_ort)
    other, _ = zoo.build("mlp", 4)  # same architecture, other random weights
    new = other.state_dict()
    with pytest.raises(BadArgumentError, match="unexpected"):
        m.load_state_dict({**new, "nope": torch.zeros(1)})
    with pytest.raises(BadArgumentError, match=r"layers.0.weight must be torch.float32\[1024, 256\]"):
        m.load_state_dict({**new, "layers.0.weight": torch.zeros(3, 3)})
    with torch.no_grad():  # the refused swaps left the old weights serving
        torch.testing.assert_close(m(*args), model(*args), rtol=1e-4, atol=1e-4)
    m.load_state_dict(new)
    assert m.backend == "onnxruntime"
    with torch.no_grad():
        torch.testing.assert_close(m(*args), other(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_mlp_on_auto_every_candidate_measured(mlp, tmp_path) -> None:
    model, args = mlp
    exported = torchmux.export(model, args)  # backend="auto": onnxruntime, inductor (AOTInductor), eager
    plan = exported.plan
    measured = {c["backend"]: c for c in plan["candidates"]}
    assert {"onnxruntime", "inductor", "eager"} <= set(measured) and all(c["ok"] for c in measured.values())
    assert plan["chosen"] == plan["candidates"][0]["backend"] and measured[plan["chosen"]]["ms"] is not None
    path = exported.save(tmp_path / "auto.tmux")
    result = _load_in_child(path, args, _eager(model, *args))
    assert result["backend"] == plan["chosen"] and result["warnings"] == [] and result["err"] < 1e-4


def test_training_mode_and_training_calls_are_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with pytest.raises(BadArgumentError, match="model.eval"):
        torchmux.export(model, (torch.randn(2, 4),), backend="eager")


class _Residual(nn.Module):
    """A transformer's residual connection as MDVC writes it (ParityBench's tenth sample): the sublayer is
    an argument of ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


def test_a_module_passed_as_an_input_is_a_clear_error_naming_the_input() -> None:
    """A package cannot store or check a module given as an argument: the error says which input and what
    to do, before any capture (it was a save of the program's input spec that failed inside every trial)."""
    with pytest.raises(BadArgumentError, match=r"'sublayer' holds a ReLU.*attribute set in __init__"):
        torchmux.export(_Residual().eval(), (torch.rand(2, 4), nn.ReLU()), backend="eager")
    with pytest.raises(BadArgumentError, match=r"'sublayer' holds a ReLU"):
        torchmux.export(_Residual().eval(), (torch.rand(2, 4),), {"sublayer": nn.ReLU()}, backend="eager")


class _NoisyLinear(nn.Linear):
    """NoisyNet's layer as Shmuma's ptan writes it (ParityBench's tenth sample): each call draws its noise
    into its own buffers, then reads them."""

    def __init__(self, sigma: float) -> None:
        super().__init__(4, 5)
        self.sigma_weight = nn.Parameter(torch.full((5, 4), sigma))
        self.register_buffer("epsilon_weight", torch.zeros(5, 4))

    def forward(self, x):
        torch.randn(self.epsilon_weight.size(), out=self.epsilon_weight)
        return nn.functional.linear(x, self.weight + self.sigma_weight * self.epsilon_weight, self.bias)


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n += 1
        return x * self.n


def test_a_buffer_written_but_never_read_is_dropped_and_one_that_is_read_refused(tmp_path) -> None:
    """A buffer the program overwrites before any read (noise drawn into it each call): no answer depends on
    what a call leaves there, so the package drops the write, as torch.export takes it (non-strict); with a
    noise scale of zero it answers as eager, with one it draws new noise each call. A counter the program
    reads (``self.n += 1``) is state its answers depend on: still refused, with what to do."""
    x = torch.randn(3, 4)
    quiet = _NoisyLinear(0.0).eval()
    exported = torchmux.export(quiet, (x,), backend="eager")
    loaded = torchmux.load(exported.save(tmp_path / "quiet.tmux"))
    torch.testing.assert_close(loaded(x), nn.functional.linear(x, quiet.weight, quiet.bias))
    noisy = torchmux.load(torchmux.export(_NoisyLinear(1.0).eval(), (x,), backend="eager").save(tmp_path / "n.tmux"))
    assert not torch.equal(noisy(x), noisy(x))
    with pytest.raises(BadArgumentError, match=r"writes state \(buffer_mutation n\)"):
        torchmux.export(_Counter().eval(), (x,), backend="eager")


class _ActNorm(nn.Module):
    """Glow's activation normalization: the first call sets a shift and a scale from the data, and a buffer
    records that it has; then a convolution and a batch norm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.logs = nn.Parameter(torch.zeros(1, c, 1, 1))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))
        self.conv, self.bn = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)

    def forward(self, x):
        if self.initialized.item() == 0:
            with torch.no_grad():
                self.loc.copy_(-x.mean(dim=(0, 2, 3), keepdim=True))
                self.logs.copy_(-torch.log(x.std(dim=(0, 2, 3), keepdim=True) + 1e-6))
                self.initialized.fill_(1)
        return self.bn(self.conv((x + self.loc) * torch.exp(self.logs)))


class _CountingGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n += 1
        if x.sum() > 0:
            return x * self.n
        return -x


def test_a_branch_on_a_buffer_is_fixed_at_export_and_a_first_call_init_refused(tmp_path) -> None:
    """torch.export traces buffers as unknown data, so ``if self.initialized.item() == 0:`` refuses in both
    modes. A package's buffers are constants: the test has one answer, and the package holds that buffer
    fixed (with a warning), its branch taken once at export; the other buffers stay swappable. A model
    whose branch would write the buffer it tests (not yet initialized) is refused with what to do, and
    left as it was; a state dict that changes the fixed buffer is refused and the old weights serve on."""
    torch.manual_seed(5)
    x = torch.randn(2, 3, 5, 5)
    model = _ActNorm(3).eval()
    with pytest.raises(torchmux.TorchmuxError, match="writes buffer\\(s\\) initialized.*call the model once"):
        torchmux.export(model, (x,), backend="eager")
    assert model.initialized.item() == 0 and not model.loc.any()  # export left the model as it was
    model(x)  # the first call initializes it
    with pytest.warns(UserWarning, match="branches on the value of buffer\\(s\\) initialized"):
        exported = torchmux.export(model, (x,), backend="onnxruntime")
    assert exported.backend == "onnxruntime"
    path = exported.save(tmp_path / "actnorm.tmux")
    result = _load_in_child(path, (x,), _eager(model, x))
    assert result["backend"] == "onnxruntime" and result["warnings"] == [] and result["err"] < 1e-4
    plan = PackageReader(path).json("plan.json")
    assert list(plan["capture"]["fixed"]) == ["initialized"]
    assert "fixed buffer (a branch tests it): initialized uint8[]" in torchmux.api.load.inspect_package(path)
    m = torchmux.load(path)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["bn.running_mean"] += 1.0
    changed = {**sd, "initialized": torch.tensor(0, dtype=torch.uint8)}
    with pytest.raises(BadArgumentError, match="initialized is a buffer the program branches on"):
        m.load_state_dict(changed)
    model.load_state_dict(sd)
    m.load_state_dict(sd)  # the same fixed value: taken, with the new statistics
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-4)
    # a counter (state) beside a branch on the data: still refused as state, and the model not run
    gate = _CountingGate().eval()
    with pytest.raises(torchmux.TorchmuxError, match="writes state"):
        torchmux.export(gate, (x,), backend="eager")
    assert gate.n.item() == 0


class _Binned(nn.Module):
    """A gradient-harmonizing loss's binning: probabilities index a table of four bins counted with .item()."""

    def forward(self, p):
        idx = torch.floor(p * 3.9999).long()
        counts = torch.zeros(4)
        for i in range(4):
            counts[i] = (idx == i).sum().item()
        return (1.0 / counts.clamp(min=1))[idx]


def test_a_program_with_values_read_as_numbers_and_no_dynamic_input_is_exported_as_is() -> None:
    """The ``.item()`` counts are symbols of the program, not sizes of its inputs: the check at the largest
    declared sizes has nothing to check (it ran the program on standard-normal values, which index past the
    table, and the export failed with the reference's IndexError); where it does run, its values come from
    the example's range, and a program that raises on them is left to the example."""
    torch.manual_seed(0)
    p = torch.rand(4, 4)
    model = _Binned().eval()
    exported = torchmux.export(model, (p,), backend="eager")
    torch.testing.assert_close(exported(p), model(p))


def test_cnn_with_batch_norm_on_auto_and_eager(tmp_path) -> None:
    torch.manual_seed(1)
    model, args = zoo.build("resnet", 2)
    expected = _eager(model, *args)
    for backend in (["onnxruntime", "eager"], "eager"):
        exported = torchmux.export(model, args, backend=backend)
        with torch.no_grad():
            torch.testing.assert_close(exported(*args), expected[0], rtol=1e-4, atol=1e-4)
        path = exported.save(tmp_path / f"cnn-{exported.backend}.tmux")
        result = _load_in_child(path, args, expected)
        assert result["backend"] == exported.backend and result["warnings"] == []
        assert result["err"] < 1e-4
    plan = PackageReader(path).json("plan.json")
    assert plan["chosen"] == "eager" and [c["backend"] for c in plan["candidates"]] == ["eager"]


def test_tiny_bert_with_a_dynamic_sequence_length(tmp_path) -> None:
    pytest.importorskip("transformers")
    torch.manual_seed(2)
    model, args = zoo.build("bert", 2)
    exported = torchmux.export(model, args, backend="onnxruntime", dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    assert exported.backend == "onnxruntime"
    path = exported.save(tmp_path / "bert.tmux")
    x = torch.randint(0, 100, (2, 19))
    # the output is a ModelOutput: transformers registers it with pytree, and the package never imports code
    out = subprocess.run(
        [sys.executable, "-c", f"import torchmux; torchmux.load({str(path)!r})"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "import transformers.modeling_outputs before torchmux.load" in out.stderr
    result = _load_in_child(path, (x,), _eager(model, x), preamble="import transformers.modeling_outputs")
    assert result["backend"] == "onnxruntime" and result["warnings"] == [] and result["err"] < 1e-4
    m = torchmux.load(path)
    with torch.no_grad():
        out = m(x)
    assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"  # the output's structure
    on_eager = torchmux.export(model, args, backend="eager", dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    result = _load_in_child(
        on_eager.save(tmp_path / "bert-eager.tmux"),
        (x,),
        _eager(model, x),
        preamble="import transformers.modeling_outputs",
    )
    assert result["backend"] == "eager" and result["warnings"] == [] and result["err"] < 1e-5


def test_outputs_are_rebuilt_as_eager_built_them() -> None:
    """The package rebuilds the output's structure with a builder made at load (api/load._builder): the
    same types, items, attributes and tensors as ``tree_unflatten`` (a Hugging Face ``ModelOutput``
    without its constructor, nested tuples, lists, dicts, named tuples, None)."""
    from typing import NamedTuple

    from torch.utils import _pytree as pytree

    from torchmux.api.load import _builder

    transformers = pytest.importorskip("transformers")

    class Pair(NamedTuple):
        a: torch.Tensor
        b: tuple

    model, args = zoo.build("bert", 1)
    with torch.no_grad():
        hf = model(*args, output_hidden_states=True)
    assert isinstance(hf, transformers.utils.ModelOutput) and hf.hidden_states is not None
    t = torch.ones(2)
    leaves, spec = pytree.tree_flatten(hf)
    build = _builder(spec)
    made = []
    post_init = transformers.utils.ModelOutput.__post_init__
    with pytest.MonkeyPatch.context() as mp:  # a ModelOutput is built without its constructor per call
        mp.setattr(transformers.utils.ModelOutput, "__post_init__", lambda self: made.append(post_init(self)))
        build(leaves)
        assert made == []
        pytree.tree_unflatten(leaves, spec)
        assert made == [None]
    for value in (hf, (t, [t * 2, {"z": t * 3, "n": None}]), Pair(t, (t * 2, None)), {"only": hf}):
        leaves, spec = pytree.tree_flatten(value)
        built, expected = _builder(spec)(leaves), pytree.tree_unflatten(leaves, spec)
        assert type(built) is type(expected) and pytree.tree_structure(built) == spec
        got = pytree.tree_leaves(built)
        assert len(got) == len(leaves) and all(a is b for a, b in zip(got, leaves))
        for b, e in [(built, expected)] + ([(built["only"], expected["only"])] if "only" in value else []):
            if isinstance(e, transformers.utils.ModelOutput):
                assert list(b.keys()) == list(e.keys()) and sorted(vars(b)) == sorted(vars(e))
                assert b.attentions is None and b[0] is b.last_hidden_state and b.to_tuple()[2] is b.hidden_states

    class Custom(dict):  # a dict subclass whose constructor does more than set its items: it keeps it
        def __init__(self, **kw):
            super().__init__(**kw)
            self.total = sum(float(v.sum()) for v in kw.values())

    pytree.register_pytree_node(
        Custom,
        lambda c: (list(c.values()), list(c)),
        lambda v, k: Custom(**dict(zip(k, v))),
        serialized_type_name="Custom",
    )
    try:
        leaves, spec = pytree.tree_flatten(Custom(a=t, b=t * 2))
        built = _builder(spec)(leaves)
        assert type(built) is Custom and built.total == 6.0
    finally:
        pytree._deregister_pytree_node(Custom)


class ProductsThenPointwise(nn.Module):
    """Eight matrix products, then a chain of pointwise ops: one value crosses between the two parts."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w1 = nn.Parameter(torch.randn(16, 16, generator=g) / 4)
        self.w2 = nn.Parameter(torch.randn(16, 16, generator=g) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in (self.w1, self.w2) * 4:
            x = x @ w
        p, q = torch.tanh(x), torch.sigmoid(x)
        for _ in range(4):
            p, q = p * q + 0.1, q - p * 0.5
        return p + q


def test_a_split_placement_ships_each_piece_in_its_native_form(tmp_path, monkeypatch) -> None:
    """``options={"split": 2}``: ONNX Runtime wins the pointwise piece, eager the products (each is late
    on the other's ops, tests/api/late_backends.py), and the package runs the two: each piece's own
    program and artifact (an ``.onnx`` model for ONNX Runtime), wired in order, loaded in a fresh
    process with no Dynamo. Where a piece's backend is missing, the next candidate runs, with a warning."""
    sys.path.insert(0, str(Path(__file__).parent))
    import late_backends

    late_backends.register()
    # eager, always a candidate, is made late on every graph here: the split must beat the whole-graph
    # candidates on its merits (in the child that loads the package, eager is itself again)
    eager = get_registry().get("eager")
    monkeypatch.setattr(
        eager, "compile", lambda request: late_backends._Late(type(eager).compile(eager, request), True)
    )
    monkeypatch.setattr(eager, "load", lambda request: late_backends._Late(type(eager).load(eager, request), True))
    model, x = ProductsThenPointwise().eval(), torch.randn(16, 16) / 4
    exported = torchmux.export(
        model, (x,), backend=["late_products", "late_pointwise"], options={"split": 2, "autotune_budget": 0.5}
    )
    assert exported.backend == "split(late_pointwise,late_products)", exported.plan["candidates"]
    path = exported.save(tmp_path / "split.tmux")
    names = PackageReader(path).names("artifacts/split/")
    assert {"artifacts/split/piece0/program.pt2", "artifacts/split/piece1/model.onnx"} <= set(names), names
    # the weights once: each piece's program holds the weights it shares with the program empty
    reader = PackageReader(path)
    pieces = reader.json("artifacts/split/meta.json")["pieces"]
    whole = program_weights(reader.read("program.pt2"))
    assert whole is not None and sum(len(p["weights"]) for p in pieces) == len(whole) > 0
    for i, p in enumerate(pieces):
        own = program_weights(reader.read(f"artifacts/split/piece{i}/program.pt2"))
        assert own is not None and all(
            own[name].size == 0 < whole[theirs].size for name, theirs in p["weights"].items()
        )
    preamble = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import late_backends; late_backends.register()"
    y = torch.randn(16, 16) / 4
    result = _load_in_child(path, (y,), _eager(model, y), preamble=preamble)
    assert result["backend"] == exported.backend and result["warnings"] == [] and result["err"] < 1e-5
    assert result["dynamo_unchanged"] and not result["tuner"]
    out = subprocess.run(
        [sys.executable, "-m", "torchmux", "package", "inspect", str(path)], capture_output=True, text=True
    )
    assert "chosen: split(late_pointwise,late_products)" in out.stdout, out.stdout + out.stderr
    assert "piece 1: 19 ops on late_products" in out.stdout, out.stdout
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match=r"split'\] is for static shapes"):
        torchmux.export(
            model,
            (x,),
            backend=["late_products", "late_pointwise"],
            dynamic_shapes=({0: Dim("batch", min=2, max=32)},),
            options={"split": 2, "autotune_budget": 0.2},
        )
    m = torchmux.load(path)  # here the late backends are installed: the split runs; new weights go to eager
    assert m.backend == exported.backend
    other = ProductsThenPointwise().eval()
    with torch.no_grad():
        other.w1.mul_(0.5)
    with pytest.warns(torchmux.TorchmuxFallbackWarning, match="not rebuilt with new weights .*eager runs them"):
        m.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(m(y), other(y))
    alone = _load_in_child(path, (y,), _eager(model, y))  # the late backends are not installed there
    assert alone["backend"] == "eager" and alone["err"] < 1e-5
    assert any("late_pointwise cannot run here" in w for w in alone["warnings"]), alone["warnings"]


def test_a_program_export_refuses_is_an_error_that_names_the_line() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.nonzero().sum() + len(set(x.tolist()))  # data-dependent Python: no graph holds it

    with pytest.raises(torchmux.TorchmuxError, match="torch.export refused the program"):
        torchmux.export(Branchy().eval(), (torch.randn(4),), backend="eager", options={"mend": False})


@pytest.mark.slow
def test_tiny_bert_on_aotinductor_with_a_dynamic_sequence_length(tmp_path) -> None:
    """AOTInductor's library covers the declared range (its Dims), and holds no weights: the package hands
    it the program's (load_constants), read from program.pt2 in a fresh process."""
    pytest.importorskip("transformers")
    torch.manual_seed(4)
    model, args = zoo.build("bert", 2)
    exported = torchmux.export(model, args, backend="inductor", dynamic_shapes=({1: Dim("seq", min=2, max=64)},))
    assert exported.backend == "inductor"
    path = exported.save(tmp_path / "bert-aoti.tmux")
    reader = PackageReader(path)
    weights = reader.json("artifacts/inductor/meta.json")["weights"]
    program_bytes = reader.manifest["members"]["program.pt2"]["size"]
    assert weights and reader.manifest["members"]["artifacts/inductor/model.pt2"]["size"] < 2 * program_bytes
    x = torch.randint(0, 100, (2, 23))
    result = _load_in_child(path, (x,), _eager(model, x), preamble="import transformers.modeling_outputs")
    assert result["backend"] == "inductor" and result["warnings"] == [] and result["err"] < 1e-4
    assert {p.split(".")[2] for p in result["plugins"]} == {"inductor"}


@pytest.mark.slow
def test_aoti_package_signed_and_a_planted_library_is_not_loaded(mlp, tmp_path) -> None:
    model, args = mlp
    exported = torchmux.export(model, args, backend="inductor")
    assert exported.backend == "inductor"
    path = exported.save(tmp_path / "mlp-aoti.tmux")
    reader = PackageReader(path)
    assert reader.trusted("artifacts/inductor/model.pt2") == (True, "")
    result = _load_in_child(path, args, _eager(model, *args))
    assert result["backend"] == "inductor" and result["warnings"] == [] and result["err"] < 1e-4

    # plant another library, with a manifest whose digest matches it: the signature does not
    planted = tmp_path / "planted.tmux"
    manifest = dict(reader.manifest)
    evil = b"\x7fELF" + os.urandom(4096)
    import hashlib

    members = {n: reader.read(n) for n in reader.names()}
    members["artifacts/inductor/model.pt2"] = evil
    manifest["members"] = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in members.items()}
    with zipfile.ZipFile(planted, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for n, d in members.items():
            z.writestr(n, d)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = torchmux.load(planted)
    assert m.backend == "inductor"  # rebuilt from the program (this user's own cached build), not loaded
    text = " ".join(str(w.message) for w in caught)
    assert "not signed" in text or "does not trust" in text, text
    with torch.no_grad():
        torch.testing.assert_close(m(*args), model(*args), rtol=1e-4, atol=1e-4)


def test_native_code_from_a_cpu_with_an_extension_this_one_lacks_is_rebuilt(mlp, tmp_path) -> None:
    """A package records the CPU extensions of the machine its native code was built on; loaded where one
    is missing (an AVX-512 or AMX library on an older CPU would die of SIGILL at its first call), that code
    is not run: the backend is rebuilt from the program, and the warning names the extension. Here the
    package is this machine's with one extension this CPU lacks added to its record, as a package built on
    a newer CPU has it."""
    from torchmux.core.machine import ISA_EXTENSIONS, isa_extensions

    here = isa_extensions()
    if here is None:
        pytest.skip("this OS does not say which extensions its CPU has (/proc/cpuinfo)")
    lacking = sorted(ISA_EXTENSIONS - here)[0]
    model, args = mlp
    exported = torchmux.export(model, args, backend="inductor")
    assert exported.backend == "inductor"
    reader = PackageReader(exported.save(tmp_path / "mlp-aoti.tmux"))
    assert set(reader.manifest["machine"]["isa"]) == set(here)
    manifest = json.loads(json.dumps(reader.manifest))
    manifest["machine"]["isa"].append(lacking)
    newer = tmp_path / "from-a-newer-cpu.tmux"
    with zipfile.ZipFile(newer, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for n in reader.names():
            z.writestr(n, reader.read(n))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = torchmux.load(newer)
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning))
    assert m.backend == "inductor" and "rebuilt from the program" in text, text
    assert f"built on a CPU with {lacking}" in text and "which this CPU" in text, text
    with torch.no_grad():
        torch.testing.assert_close(m(*args), model(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_tvm_package_with_a_dynamic_batch_holds_one_symbolic_library(tmp_path) -> None:
    """TVM's library built with Relax's symbolic shapes covers the declared range: the package holds it
    (signed) and a fresh process loads it, with no rebuild and no warning, at a batch size it was not
    exported with."""
    pytest.importorskip("tvm")
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    exported = torchmux.export(
        model, (torch.randn(4, 16),), backend="tvm", dynamic_shapes=({0: Dim("batch", min=1, max=64)},)
    )
    assert exported.backend == "tvm"
    path = exported.save(tmp_path / "tvm-dynamic.tmux")
    assert PackageReader(path).trusted("artifacts/tvm/model.so") == (True, "")
    x = torch.randn(11, 16)
    result = _load_in_child(path, (x,), _eager(model, x))
    assert result["backend"] == "tvm" and result["warnings"] == [] and result["err"] < 1e-4, result


@pytest.mark.slow
def test_tvm_package_holds_its_exported_library(tmp_path) -> None:
    pytest.importorskip("tvm")
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    exported = torchmux.export(model, (x,), backend="tvm")
    assert exported.backend == "tvm"
    path = exported.save(tmp_path / "tvm.tmux")
    assert PackageReader(path).trusted("artifacts/tvm/model.so") == (True, "")
    result = _load_in_child(path, (x,), _eager(model, x))
    assert result["backend"] == "tvm" and result["warnings"] == [] and result["err"] < 1e-4


def test_a_candidate_with_no_compiled_form_in_the_package_is_rebuilt_and_the_warning_says_why(tmp_path) -> None:
    """The example plugin saves nothing (a plugin of contract 2) and claims only pointwise ops: a model it
    takes whole is rebuilt at load because its backend saves no compiled form; one whose matmuls stay on
    eager is placed as several regions, or as one region with eager ops beside it, which a package does
    not store (the last was reported as "saves no compiled form"). Each load's one warning says
    which, and the rebuilt package answers as eager."""
    pytest.importorskip("torchmux_example_plugin")
    torch.manual_seed(5)
    cases = [
        (Pointwise().eval(), "its backend saves no compiled form"),
        (
            nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh()).eval(),
            "regions with ops left to eager",
        ),
        (nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Tanh()).eval(), "leaves 2 op(s) to eager beside its one region"),
    ]
    x = torch.randn(4, 8)
    for i, (model, why) in enumerate(cases):
        exported = torchmux.export(model, (x,), backend="example")
        assert exported.backend == "example"
        assert exported.plan["candidates"][0]["artifact"] is None and why in exported.plan["candidates"][0]["unsaved"]
        path = exported.save(tmp_path / f"example{i}.tmux")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torchmux.TorchmuxFallbackWarning)
            m = torchmux.load(path)
        notes = [str(w.message) for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning)]
        assert m.backend == "example" and len(notes) == 1 and why in notes[0], notes
        with torch.no_grad():
            torch.testing.assert_close(m(x), model(x))


class Pointwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x.relu() * 2.0 + x)


# --- research code's shapes that a package met on ParityBench modules no session tuned for -----------------


class WithIndex(nn.Module):
    """``forward(x, res, i)`` with ``i`` a layer's index, a Python int (a text-matching model's residual)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, res: torch.Tensor, i: int) -> torch.Tensor:
        if i == 1:
            res = self.linear(res)
        return (x + res) * 0.5


def test_a_python_value_among_the_inputs_is_fixed_and_checked_at_each_call(tmp_path) -> None:
    """torch.export specializes the program to ``i``'s value and keeps an input no node reads: the IR and
    the backend take the tensors, the plan holds the value, and the package's call checks it (eager's
    runner puts it back between the tensors)."""
    torch.manual_seed(7)
    model = WithIndex().eval()
    args = (torch.randn(2, 4), torch.randn(2, 4), 1)
    exported = torchmux.export(model, args, backend="onnxruntime")
    assert exported.backend == "onnxruntime" and exported.plan["constants"] == [[2, 1]]
    path = exported.save(tmp_path / "index.tmux")
    with torch.no_grad():
        for backend in ("onnxruntime", "eager"):
            m = torchmux.load(path, backend=backend)
            assert m.backend == backend
            torch.testing.assert_close(m(*args), model(*args))
            with pytest.raises(
                PackageInputError, match="argument 2 must be 1: the program was exported with that value.*got 0"
            ):
                m(args[0], args[1], 0)


class WritesItsInput(nn.Module):
    """An SSD's L2Norm: ``x /= norm`` on the argument, then a per-channel scale."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10
        x /= norm
        return self.weight.view(1, 4, 1, 1) * x


@pytest.mark.slow
def test_a_program_that_writes_its_input_runs_on_each_backend_and_leaves_the_callers_tensor(tmp_path) -> None:
    """torch.export's graph keeps the in-place op: eager's runner and AOTInductor's library would write the
    caller's tensor, which the check refused (and then no backend, eager included, was left: an error).
    Each copies its inputs now; every package answers as eager and leaves the caller's tensor as it was."""
    model = WritesItsInput().eval()
    x = torch.rand(2, 4, 3, 3)
    expected = model(x.clone())
    for backend in ("eager", "onnxruntime", "inductor"):
        with pytest.warns(UserWarning, match="writes its input"):
            exported = torchmux.export(model, (x.clone(),), backend=backend)
        assert exported.backend == backend
        m = torchmux.load(exported.save(tmp_path / f"{backend}.tmux"))
        given = x.clone()
        with torch.no_grad():
            torch.testing.assert_close(m(given), expected)
        assert torch.equal(given, x), backend


class CachedGrid(nn.Module):
    """A deformable convolution's sampling grid: built with NumPy in the forward and cached on the module."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self._grid: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._grid is None or self._grid.shape[0] != x.shape[0]:
            import numpy as np

            self._grid = torch.from_numpy(np.arange(x.shape[0] * 4, dtype=np.float32).reshape(x.shape[0], 4))
        return self.linear(x) + self._grid


@pytest.mark.slow
def test_aoti_library_keeps_a_constant_inductor_named_itself(tmp_path) -> None:
    """Inductor names such a constant ``_tensor_constant0``, which no program weight is called: the library
    compiled to read the program's weights could not run, and inductor failed on the program. It is built
    again holding its weights itself, and loads and answers as eager."""
    torch.manual_seed(9)
    model = CachedGrid().eval()
    x = torch.randn(3, 4)
    exported = torchmux.export(model, (x,), backend="inductor")
    assert exported.backend == "inductor"
    assert exported.saved["inductor"].meta["own_weights"] is True
    result = _load_in_child(exported.save(tmp_path / "grid.tmux"), (x,), _eager(model, x))
    assert result["backend"] == "inductor" and result["warnings"] == [] and result["err"] < 1e-5


class NormThenPick(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)[:, 0]


def test_a_scalar_weight_by_reference_keeps_its_shape(tmp_path) -> None:
    """ONNX's scalar index 0 has the bytes of batch norm's ``num_batches_tracked`` (0-d int64) and is stored by
    reference to it; handed to ONNX Runtime as a 1-element array it was refused (``dimensions do not match``)
    and the saved form never loaded. The package's own session opens now."""
    torch.manual_seed(11)
    model = NormThenPick().eval()
    x = torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torchmux.TorchmuxFallbackWarning)
        exported = torchmux.export(model, (x,), backend="onnxruntime")
    assert not [w for w in caught if "saved form failed" in str(w.message)]
    assert "bn.num_batches_tracked" in exported.saved["onnxruntime"].meta["weights"].values()
    result = _load_in_child(exported.save(tmp_path / "bn.tmux"), (x,), _eager(model, x))
    assert result["backend"] == "onnxruntime" and result["warnings"] == [] and result["err"] < 1e-5


class Projection(nn.Module):
    """Two linears on a 3-D input: ONNX's MatMul reads each weight through a Transpose, which ONNX Runtime's
    optimizer folds into a transposed copy of the weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_an_onnx_package_opens_the_model_onnx_runtime_optimized_at_export(tmp_path) -> None:
    """ONNX Runtime's graph optimizations run once, at export: the package holds the optimized model beside
    the portable one, the weights its optimizer transposed stored as references to the program's (no second
    copy), and a load under the same ONNX Runtime opens it with no optimization pass (no convolution to lay
    out); under another ONNX Runtime version, the portable model, optimized there. Both answer as eager."""
    import onnxruntime as ort

    from torchmux.backends.onnxruntime import session

    torch.manual_seed(12)
    model, x = Projection().eval(), torch.randn(2, 5, 8)
    exported = torchmux.export(model, (x,), backend="onnxruntime")
    saved = exported.saved["onnxruntime"]
    optimized = saved.meta["optimized"]
    assert "model.opt.onnx" in saved.files and optimized["layout"] is False
    assert set(optimized["transposed"].values()) == {"a.weight", "b.weight"}
    assert model.a.weight.detach().numpy().T.tobytes() not in saved.files["model.opt.onnx"]
    program = exported.program
    arrays = {k: v.detach().numpy() for k, v in {**program.state_dict, **program.constants}.items()}
    request = extend.LoadRequest(saved, "cpu", 1, {}, lambda: program, lambda: arrays)
    elsewhere = extend.SavedGraph(saved.files, {**saved.meta, "onnxruntime": "1.0.0"}, saved.native)
    levels = ort.GraphOptimizationLevel
    for req, level in ((request, levels.ORT_DISABLE_ALL), (replace(request, saved=elsewhere), levels.ORT_ENABLE_ALL)):
        fn = session.load_graph(req)
        assert fn.session.get_session_options().graph_optimization_level == level
        with torch.no_grad():
            torch.testing.assert_close(fn(x)[0], model(x), rtol=1e-5, atol=1e-6)
    result = _load_in_child(exported.save(tmp_path / "projection.tmux"), (x,), _eager(model, x))
    assert result["backend"] == "onnxruntime" and result["warnings"] == [] and result["err"] < 1e-5


class ReturnsItsBuffers(nn.Module):
    """A domain-adaptation model's centroids: ``forward()`` returns two buffers as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("centroid_s", torch.arange(8.0).reshape(2, 4))
        self.register_buffer("centroid_t", -torch.arange(8.0).reshape(2, 4))

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.centroid_s, self.centroid_t


def test_a_program_that_returns_its_weights_is_not_a_backend_reusing_its_outputs(tmp_path) -> None:
    """Each call returns the same buffers, rightly: the second-call check took that for reused output
    buffers and failed every candidate, eager included."""
    model = ReturnsItsBuffers().eval()
    for backend in ("eager", "onnxruntime"):
        exported = torchmux.export(model, (), backend=backend)
        assert exported.backend == backend
        m = torchmux.load(exported.save(tmp_path / f"{backend}.tmux"))
        for got, want in zip(m(), model()):
            torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_tvm_takes_an_empty_input(tmp_path) -> None:
    """An empty tensor's strides are torch's (a size-0 dimension counted as 1); TVM refused the call."""
    pytest.importorskip("tvm")
    model = Pointwise().eval()
    x = torch.rand(4, 4, 0, 4)
    exported = torchmux.export(model, (x,), backend="tvm")
    assert exported.backend == "tvm"
    m = torchmux.load(exported.save(tmp_path / "empty.tmux"))
    assert m(x).shape == (4, 4, 0, 4)


class BilinearHead(nn.Module):
    """A discriminator's bilinear score (``aten._trilinear``, which TVM does not claim) between two MLPs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.score = nn.Linear(8, 8), nn.Linear(8, 8), nn.Bilinear(8, 8, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.score(torch.relu(self.a(x)), torch.relu(self.b(y))))


@pytest.mark.slow
def test_a_package_rebuilds_a_placement_of_several_regions_as_export_placed_it(tmp_path) -> None:
    """TVM leaves ``_trilinear`` to eager between its regions; the package stores no graph for that, and
    load rebuilt it by handing TVM the whole graph, which it refused: the package ran eager. The rebuild
    places it as export did."""
    pytest.importorskip("tvm")
    torch.manual_seed(13)
    model = BilinearHead().eval()
    args = (torch.randn(4, 8), torch.randn(4, 8))
    exported = torchmux.export(model, args, backend="tvm")
    assert exported.backend == "tvm" and "regions" in exported.plan["candidates"][0]["unsaved"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torchmux.TorchmuxFallbackWarning)
        m = torchmux.load(exported.save(tmp_path / "bilinear.tmux"))
    notes = [str(w.message) for w in caught if issubclass(w.category, torchmux.TorchmuxFallbackWarning)]
    assert m.backend == "tvm" and len(notes) == 1 and "rebuilt from the program" in notes[0], notes
    with torch.no_grad():
        torch.testing.assert_close(m(*args), model(*args))


class ArgmaxTest(nn.Module):
    """``.item()`` of an argmax in an if-test: the program holds an unbacked size whose range is unbounded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum(0).argmax().item() == 3:
            x = x * 2
        return x - 1


class DropoutInABranch(nn.Module):
    """A dropout in one branch of a data-dependent ``if`` (the mend pass makes it ``torch.cond``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:
            y = nn.functional.dropout(x, 0.5, True)
        else:
            y = x * 0.5
        return y


def test_programs_of_the_corpus_that_failed_on_their_way_through_a_package(tmp_path) -> None:
    """Found by ``export_coverage.py --corpus --package auto``: an unbacked ``.item()`` size's range ends at
    torch's own infinity, which ``int()`` cannot take (``'Infinity' object has no attribute '_mpf_'``), and
    a dropout inside ``torch.cond``'s branch was not seen as random, so every candidate, eager included,
    was compared by value and refused."""
    torch.manual_seed(17)
    x = torch.randn(4, 16)
    x[:, 3] += 10  # the argmax is 3: the taken branch
    model = ArgmaxTest().eval()
    exported = torchmux.export(model, (x,), backend="onnxruntime")
    assert exported.backend == "onnxruntime"
    assert all(hi is None for lo, hi in exported.plan["symbols"].values())  # the unbacked size, unbounded
    m = torchmux.load(exported.save(tmp_path / "argmax.tmux"))
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x))
    noisy = DropoutInABranch().eval()
    exported = torchmux.export(noisy, (x.abs(),), backend="eager")
    assert exported.backend == "eager"
    m = torchmux.load(exported.save(tmp_path / "dropout.tmux"))
    out = m(x.abs())
    assert out.shape == x.shape and bool(((out == 0) | (out == 2 * x.abs())).all())  # dropout's own draws


def test_a_backend_that_answers_each_shape_as_it_first_did_is_caught_on_other_values() -> None:
    """A real backend (eager's, through the public contract) that keeps its first answer per input shape:
    right on the trial's two calls, which repeat the example's values, and wrong on any other. The
    package checks each candidate as it ships on other values of the same shapes too (the example's
    rolled one place), so it fails with that reason and the package runs eager, right on new inputs."""
    from torchmux.backends.eager import EagerBackend

    class FirstAnswerPerShape(EagerBackend):
        name = "test_first_answer_per_shape"
        auto = False

        def compile(self, request):  # type: ignore[no-untyped-def]
            inner, first = super().compile(request), {}

            def run(*args):  # type: ignore[no-untyped-def]
                key = tuple(tuple(a.shape) for a in args)
                if key not in first:
                    first[key] = [t.clone() for t in inner(*args)]
                return [t.clone() for t in first[key]]

            return run

        def save(self, compiled, request):  # type: ignore[no-untyped-def]
            return None  # ships as compiled (eager's saved form is the program itself, loaded right)

    if FirstAnswerPerShape.name not in get_registry().names:
        torchmux.register_plugin(FirstAnswerPerShape())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).eval()
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        exported = torchmux.export(model, (x,), backend=[FirstAnswerPerShape.name, "eager"])
    row = next(c for c in exported.plan["candidates"] if c["backend"] == FirstAnswerPerShape.name)
    assert not row["ok"] and "on other input values: wrong answer" in row["reason"], row
    assert exported.backend == "eager"
    with torch.no_grad():
        y = torch.randn(4, 8)
        torch.testing.assert_close(exported(y), model(y))


def test_an_onnx_package_of_a_squeeze_that_squeezes_nothing_loads() -> None:
    """``x.squeeze(2)`` where that dimension is 4 does nothing in torch; torch's ONNX exporter writes a
    ``Squeeze`` of axis 2 anyway, which ONNX Runtime refused to load, so the package ran eager (an
    attention module of two ParityBench samples). The package's ONNX model squeezes only axes of size 1."""

    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.full = nn.Linear(4, 1)

        def forward(self, enc: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            att = self.full(torch.relu(enc + hidden.unsqueeze(1))).squeeze(2).squeeze(3)
            return torch.softmax(att, dim=1)

    torch.manual_seed(0)
    model, args = Scores().eval(), (torch.rand(4, 4, 4, 4), torch.rand(4, 4, 4, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exported = torchmux.export(model, args, backend="onnxruntime")
    assert exported.backend == "onnxruntime", [str(w.message)[:300] for w in caught]
    with torch.no_grad():
        torch.testing.assert_close(exported(*args), model(*args))


class _Homography(torch.nn.Module):
    """A homography from four point pairs (ParityBench: ignacio_rocco_cnngeometric_pytorch), reduced: its
    ``torch.inverse`` exports with an effect token (the error check's ordering), which is no state."""

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        a = theta.view(-1, 8, 8) + torch.eye(8) * 4
        return torch.bmm(torch.inverse(a), a[:, :, :1]).squeeze(2)


def test_a_program_whose_ops_carry_effect_tokens_exports_and_loads(tmp_path) -> None:
    """torch.export takes it whole (non-strict); so does torchmux.export, tokens removed as torch's own pass
    does, and the package answers as eager does in another load."""
    model, x = _Homography().eval(), torch.randn(2, 64)
    assert any(
        s.kind.name == "TOKEN"
        for s in torch.export.export(model, (x,)).run_decompositions().graph_signature.output_specs
    )
    exported = torchmux.export(model, (x,), backend="eager")
    loaded = torchmux.load(exported.save(tmp_path / "homography.tmux"))
    y = torch.randn(2, 64)
    torch.testing.assert_close(loaded(y), model(y))
