"""A third-party backend written from plugins.md alone (tests/plugins/torchmux-numpy-plugin), taken
down the author's path end to end: its module imports before it has a claims file, the probe writes
that file from the module path, ``pip install`` builds and installs it as a real package, and its own
pytest file (one line of ``torchmux.testing``) passes against the installed entry point."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).with_name("torchmux-numpy-plugin")
CLAIMS = "torchmux_numpy_plugin/claims.json"


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # a pip build, the probe over every case, and the kit: about two minutes on 2 cores
def test_a_fresh_plugin_from_first_claims_file_to_its_own_passing_suite(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    (source / CLAIMS).unlink()  # a new plugin: no claims file yet
    env = {**os.environ, "TORCHMUX_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(source)}
    env.pop("TORCHMUX_PLUGINS", None)

    # 1. without a claims file the module imports: it claims nothing, and says how to write the file
    imported = _run(
        [sys.executable, "-c", "import torchmux_numpy_plugin as p; print(p.NumpyBackend.claims)"], source, env
    )
    assert imported.returncode == 0, imported.stderr
    assert "does not exist yet" in imported.stderr and "python -m torchmux.testing.probe" in imported.stderr
    assert imported.stdout.strip() == "{}"

    # 2. the probe takes the module path (the plugin is not installed: no entry point names it yet)
    probed = _run(
        [sys.executable, "-m", "torchmux.testing.probe", "torchmux_numpy_plugin", "--write", CLAIMS], source, env
    )
    assert probed.returncode == 0, probed.stderr[-3000:]
    written = json.loads((source / CLAIMS).read_text())
    shipped = json.loads((PLUGIN / CLAIMS).read_text())
    assert {k: v for k, v in written.items() if k != "command"} == {k: v for k, v in shipped.items() if k != "command"}
    assert len(written["float32"]) >= 15 and written["nonfinite_unsafe"] == ["aten.relu.default"]

    # 3. a real pip install (a wheel built from the project, into its own folder)
    site = tmp_path / "site"
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        tmp_path,
        env,
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    assert (site / CLAIMS).is_file(), "claims.json is package data: the wheel must carry it"

    # 4. the plugin's own pytest file, against the installed package (found through its entry point)
    env = {**env, "PYTHONPATH": str(site)}
    tests = tmp_path / "plugin_tests"
    shutil.copytree(source / "tests", tests)
    ran = _run(
        [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:randomly", "-p", "no:cacheprovider"], tmp_path, env
    )
    assert ran.returncode == 0, ran.stdout[-4000:]
    summary = ran.stdout.strip().splitlines()[-1]  # "34 passed, 1 skipped, ... in 145.18s"
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, summary
    listed = _run([sys.executable, "-m", "torchmux", "list"], tmp_path, env)
    assert "numpy_interp" in listed.stdout and "torchmux-numpy-plugin" in listed.stdout, listed.stdout
