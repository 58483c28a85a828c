"""The house plan, kept honest: imports run one way through the folders.

    frontends/ (capture) -> core/ (IR, contract) -> autotune/ (placement, tuning) -> backends/
    with api/ (compile, explain, CLI), bench/ and testing/ on top.

- ``core/`` imports nothing above it (no frontends, autotune, backends, api, bench, testing).
- ``frontends/`` and ``autotune/`` import only ``core/`` (and themselves): neither knows the other,
  nor any backend; ``api/`` wires them together.
- A backend imports only public names: ``torchmux`` itself, ``torchmux.extend``, and its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "frontends", "autotune", "backends", "api", "bench", "testing")
ALLOWED = {
    "core": {"core"},
    "frontends": {"core", "frontends"},
    "autotune": {"core", "autotune"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every torchmux module ``path`` imports, as a dotted name under torchmux ('' for the root)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "torchmux" or node.module.startswith("torchmux.")):
                mod = node.module.removeprefix("torchmux").lstrip(".")
            else:
                continue
            out += [(node.lineno, f"{mod}.{a.name}".lstrip(".")) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name.removeprefix("torchmux").lstrip("."))
                for a in node.names
                if a.name == "torchmux" or a.name.startswith("torchmux.")
            ]
    return out


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_lower_layers_import_nothing_above(layer: str) -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports torchmux.{mod}"
        for p in _files(layer)
        for line, mod in _imports(p)
        if mod.split(".")[0] in LAYERS and mod.split(".")[0] not in ALLOWED[layer]
    ]
    assert not bad, f"{layer}/ may import only {sorted(ALLOWED[layer])}:\n" + "\n".join(bad)


def test_backends_use_only_the_public_kit() -> None:
    bad = []
    for p in _files("backends"):
        own = ".".join(("backends",) + p.relative_to(ROOT / "backends").parts[:1]).removesuffix(".py")
        for line, mod in _imports(p):
            public = mod.split(".")[0] not in LAYERS  # torchmux's root names and torchmux.extend
            if not (public or mod == own or mod.startswith(own + ".")):
                bad.append(f"{p.relative_to(ROOT)}:{line} imports torchmux.{mod}")
    assert not bad, "a backend imports only torchmux, torchmux.extend and its own package:\n" + "\n".join(bad)


def test_the_checker_sees_imports() -> None:
    """The checks above would pass vacuously if the parser found nothing: it finds the kit's imports."""
    mods = {m for _, m in _imports(ROOT / "backends" / "eager.py")}
    assert "extend" in mods
    assert any(m.startswith("core.") for _, m in _imports(ROOT / "extend.py"))
