"""The backend conformance suite: torchmux's author kit (``torchmux.testing.conformance_tests``) run on
every installed backend, exactly as a plugin author runs it on theirs.

For each backend ``list_backends()`` reports, one generated test function per device, parametrized over
the kit's plan: every op the backend claims, in every floating dtype it lists (values, inputs left
unchanged, no aliasing, fresh outputs, a second call: the runtime's own ``check_call``), NaN/±inf
(marked ``slow``), symbolic sizes for a backend with ``dynamic_shapes``, and a model through
``torchmux.compile`` (frozen weights, regions). Inductor claims every op; compiling 79 graphs with it
would take many minutes on 2 cores, so it runs one case per op family and no model (it is PyTorch's
own, tested by PyTorch's suite); TVM's model check is ``slow``. GPU tests are marked ``gpu`` and skip
without CUDA. Only public names are imported: a plugin's suite can be this file.
"""

from __future__ import annotations

import pytest

import torchmux
from torchmux.testing import CASES, CASES_BY_OP, conformance_tests, resolve_backend

SAMPLED = {"inductor"}  # backends that run one case per op family, and no model
NAMES = [r.name for r in torchmux.list_backends() if not r.name.startswith("(")]  # "(plugin)": a broken plugin


def _suite(name: str, device: str):
    marks = {"nonfinite": [pytest.mark.slow], "model": [pytest.mark.slow] if name == "tvm" else []}
    if device == "cuda":
        marks = {kind: [*m, pytest.mark.gpu] for kind, m in {**marks, "op": [], "sizes": []}.items()}
    checks = ("op", "nonfinite", "sizes") if name in SAMPLED else ("op", "nonfinite", "sizes", "model")
    return conformance_tests(name, device=device, checks=checks, one_per_family=name in SAMPLED, marks=marks)


for _name in NAMES:
    globals()[f"test_{_name}_cpu"] = _suite(_name, "cpu")
    globals()[f"test_{_name}_cuda"] = _suite(_name, "cuda")


@pytest.mark.parametrize("backend_name", NAMES)
def test_claims_come_from_the_suite(backend_name: str) -> None:
    """A backend's claims name only ops the suite has a case for (no guessing)."""
    backend = resolve_backend(backend_name)
    claimed = set().union(*backend.claims.values()) if backend.claims else set(backend.ops or ())
    if backend.claims is None and backend.ops is None:
        pytest.skip(f"{backend_name} claims every op: the suite runs it on every case it can")
    unknown = sorted(claimed - set(CASES_BY_OP))
    assert not unknown, f"{backend_name} claims ops the conformance suite does not test: {unknown}"


def test_suite_covers_at_least_60_ops() -> None:
    assert len(CASES_BY_OP) >= 60
    assert {c.family for c in CASES} >= {"pointwise", "reduction", "matmul", "conv", "norm", "view", "compare"}


def test_the_suite_imports_only_what_a_plugin_author_can() -> None:
    """Built on the public kit alone: a plugin's own suite can be a copy of this file."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in names if m.startswith("torchmux")} <= {"torchmux", "torchmux.testing", "torchmux.extend"}
