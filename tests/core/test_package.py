"""core/package.py: members read as views of the file, checked by their SHA-256 (real zip archives)."""

from __future__ import annotations

import io
import zipfile

import pytest

from torchmux.core.package import PackageError, PackageReader, stored_members, write_package

MEMBERS = {"plan.json": b'{"chosen": "eager"}', "artifacts/x/blob.bin": bytes(range(256)) * 300}


def test_stored_members_are_views_of_the_archive(tmp_path) -> None:
    path = write_package(tmp_path / "p.tmux", MEMBERS, native=set(), info={})
    raw = path.read_bytes()
    views = stored_members(zipfile.ZipFile(io.BytesIO(raw)), raw)
    assert views is not None and {k: bytes(v) for k, v in views.items() if k in MEMBERS} == MEMBERS
    reader = PackageReader(path)
    assert reader.read("artifacts/x/blob.bin") == MEMBERS["artifacts/x/blob.bin"]
    assert reader.json("plan.json") == {"chosen": "eager"}


def test_a_compressed_member_is_read_through_zip(tmp_path) -> None:
    """An archive another tool rewrote with compression: no views, every member still checked."""
    path = write_package(tmp_path / "p.tmux", MEMBERS, native=set(), info={})
    src = zipfile.ZipFile(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for name in src.namelist():
            out.writestr(name, src.read(name))
    raw = buf.getvalue()
    assert stored_members(zipfile.ZipFile(io.BytesIO(raw)), raw) is None
    (tmp_path / "q.tmux").write_bytes(raw)
    assert PackageReader(tmp_path / "q.tmux").read("artifacts/x/blob.bin") == MEMBERS["artifacts/x/blob.bin"]


def test_a_flipped_byte_inside_a_member_names_it(tmp_path) -> None:
    path = write_package(tmp_path / "p.tmux", MEMBERS, native=set(), info={})
    raw = bytearray(path.read_bytes())
    at = raw.index(bytes(range(256)))  # the blob's bytes, stored as they are
    raw[at + 1000] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(PackageError, match="artifacts/x/blob.bin is damaged or altered .*SHA-256"):
        PackageReader(path)


def test_a_directory_that_points_past_the_end_is_an_error(tmp_path) -> None:
    path = write_package(tmp_path / "p.tmux", MEMBERS, native=set(), info={})
    raw = path.read_bytes()
    z = zipfile.ZipFile(io.BytesIO(raw))
    blob = z.getinfo("artifacts/x/blob.bin")
    blob.header_offset += 7  # the central directory now names a place with no local header
    with pytest.raises(zipfile.BadZipFile, match="no local header"):
        stored_members(z, raw)


def _program_archive() -> bytes:
    """A real ``torch.export.save`` archive of a small module with three weights."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7)).eval()
    buf = io.BytesIO()
    torch.export.save(torch.export.export(model, (torch.randn(2, 5),)), buf)
    return buf.getvalue()


def test_members_start_on_64_byte_boundaries_and_weights_are_views_of_the_checked_buffer(tmp_path) -> None:
    """Weights in place (module docstring): the program's tensors come out of the reader's own buffer, aligned
    and writable, without a copy; an archive written without the padding (another tool, an older torchmux)
    gives copies, as aligned and writable."""
    import numpy as np

    from torchmux.core.package import ALIGN, PROGRAM, program_weights

    program = _program_archive()
    path = write_package(tmp_path / "p.tmux", {**MEMBERS, PROGRAM: program}, native=set(), info={})
    raw = path.read_bytes()
    views = stored_members(zipfile.ZipFile(io.BytesIO(raw)), raw)
    assert views is not None
    for info in zipfile.ZipFile(path).infolist():  # each member's data, the manifest's too
        assert raw.find(bytes(views[info.filename]), info.header_offset) % ALIGN == 0, info.filename

    reader = PackageReader(path)
    buffer = np.frombuffer(reader.view(PROGRAM), dtype=np.uint8)
    assert buffer.ctypes.data % ALIGN == 0
    weights = program_weights(reader.view(PROGRAM))
    assert weights is not None and set(weights) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    for array in weights.values():
        assert array.flags.writeable and array.flags.aligned and np.shares_memory(array, buffer)

    # the same archive stored at an odd offset (no padding): every weight copied, the same values
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("pad", b"x")
        z.writestr(PROGRAM, program)
    odd = stored_members(zipfile.ZipFile(io.BytesIO(buf.getvalue())), bytearray(buf.getvalue()))
    assert odd is not None
    copied = program_weights(odd[PROGRAM])
    assert copied is not None
    for name, array in copied.items():
        assert array.flags.writeable and array.flags.aligned and not np.shares_memory(array, buffer)
        assert np.array_equal(array, weights[name])


def test_writes_in_place_means_the_callers_inputs_only() -> None:
    """A runner copies its inputs only where the program writes one of them (directly or through a view):
    ``nn.ReLU(inplace=True)`` after a convolution writes a value the program made, and a ResNet's package
    must not pay a copy of its input on every call for it."""
    import torch
    from torch import nn

    from torchmux.core.package import writes_in_place

    class Divides(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x /= x.norm()
            return x * 2

    class ThroughAView(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.view(-1).mul_(2)
            return x + 1

    conv_then_relu = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU(inplace=True))
    relu_first = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(3, 3, 1))
    x = torch.rand(2, 3, 4, 4)
    verdicts = {
        name: writes_in_place(torch.export.export(m.eval(), (x.clone(),)))
        for name, m in [
            ("divides", Divides()),
            ("view", ThroughAView()),
            ("conv", conv_then_relu),
            ("relu", relu_first),
        ]
    }
    assert verdicts == {"divides": True, "view": True, "conv": False, "relu": True}


def test_a_build_in_another_process_is_waited_for_then_found(tmp_path) -> None:
    """``extend.building``: a process that builds into a folder another process is building into waits for
    it (then finds its file, instead of writing the same files at the same time), and past its wait goes on
    unlocked, saying so."""
    import subprocess
    import sys
    import time

    from torchmux.extend import building

    holder = (
        "import sys, time, pathlib\n"
        "from torchmux.extend import building\n"
        "folder = pathlib.Path(sys.argv[1])\n"
        "with building(folder) as held:\n"
        "    print('held' if held else 'not held', flush=True)\n"
        "    time.sleep(1.5)\n"
        "    (folder / 'model.pt2').write_bytes(b'built')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with building(tmp_path, wait=0.2) as held:  # the other build is not done: not held, no file yet
            assert not held and not (tmp_path / "model.pt2").exists()
        started = time.monotonic()
        with building(tmp_path) as held:
            assert held and (tmp_path / "model.pt2").read_bytes() == b"built"
        assert time.monotonic() - started > 0.5  # it waited for the other process
    finally:
        child.wait(timeout=60)
    assert child.returncode == 0
