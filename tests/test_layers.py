"""The import graph is layered: core <- perf <- policies <- scheduler <- driver <- sim, runtime <- cli.

Every ``import`` in ``src/gpuloom`` (module level or inside a function) is read
with :mod:`ast`; a module may import from its own package and from layers below
its own, never from a layer above or from its peer (``sim`` and ``runtime`` are
one layer and do not import each other).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuloom"

#: package (first component under gpuloom) -> layer
LAYER = {"core": 0, "perf": 1, "policies": 2, "scheduler": 3, "driver": 4, "sim": 5, "runtime": 5, "cli": 6,
         "__init__": 7, "__main__": 7}  # the package and its entry point sit on top


def _package(module: str) -> str:
    """``gpuloom.sim.engine`` -> ``sim``; ``gpuloom.scheduler`` -> ``scheduler``."""
    parts = module.split(".")
    assert parts[0] == "gpuloom", module
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every gpuloom import in ``path``."""
    mod = _module_name(path)
    is_pkg = path.name == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "gpuloom"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                target = ".".join(up + ([node.module] if node.module else []))
                if node.module is None:  # from . import x: each name may be a module
                    out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
                    continue
            else:
                target = node.module or ""
            if target.split(".")[0] == "gpuloom":
                out.append((node.lineno, target))
    return out


def layer_violations() -> list[str]:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        mod = _module_name(path)
        src_pkg = _package(mod) if mod != "gpuloom" else "__init__"
        src_layer = LAYER[src_pkg]
        for line, target in _imports(path):
            if target == "gpuloom":
                continue
            dst_pkg = _package(target)
            if dst_pkg == src_pkg:
                continue
            dst_layer = LAYER.get(dst_pkg)
            if dst_layer is None:
                continue  # a module of the top package that is not a layer (none today)
            if dst_layer >= src_layer:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {src_pkg} (layer {src_layer}) imports "
                           f"{target} ({dst_pkg}, layer {dst_layer})")
    return bad


def test_no_import_points_up_or_sideways() -> None:
    assert layer_violations() == []


def test_every_package_has_a_layer() -> None:
    pkgs = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    mods = {p.stem for p in SRC.glob("*.py")}
    assert pkgs | mods <= set(LAYER), sorted((pkgs | mods) - set(LAYER))


@pytest.mark.parametrize("src,dst,expected", [("sim", "runtime", True), ("perf", "policies", True),
                                               ("driver", "scheduler", False), ("cli", "sim", False)])
def test_the_rule_itself(src: str, dst: str, expected: bool) -> None:
    # the check fails on an upward or sideways import, and passes a downward one
    assert (LAYER[dst] >= LAYER[src]) is expected
