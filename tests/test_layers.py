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


# -- runtime/ in rooms -------------------------------------------------------------------------------------
#: room under gpuloom.runtime -> its order: a room imports from its own room and the rooms below it
#: (exec: processes and machines; state: what is stored; service: the loop; api: the HTTP door)
ROOM = {"exec": 0, "state": 1, "service": 2, "api": 3}
RUNTIME = SRC / "runtime"


def _room(module: str) -> str | None:
    """``gpuloom.runtime.state.store`` -> ``state``; None outside runtime's rooms."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["gpuloom", "runtime"] and len(parts) > 2 else None


def room_violations() -> list[str]:
    bad = []
    for path in sorted(RUNTIME.rglob("*.py")):
        src = _room(_module_name(path))
        if src is None:  # runtime/__init__.py
            continue
        for line, target in _imports(path):
            dst = _room(target)
            if dst is not None and ROOM.get(dst, 99) > ROOM[src]:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {src} (room {ROOM[src]}) imports "
                           f"{target} ({dst}, room {ROOM.get(dst)})")
    return bad


def test_runtime_rooms_import_only_their_own_and_lower_rooms() -> None:
    assert room_violations() == []


def test_every_runtime_module_is_in_a_room() -> None:
    loose = [p.name for p in RUNTIME.glob("*.py") if p.name != "__init__.py"]
    rooms = {p.name for p in RUNTIME.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert loose == [] and rooms == set(ROOM)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``root``'s package it imports (every import, ``TYPE_CHECKING`` ones too;
    ``from pkg import mod`` counts as importing ``pkg.mod``)."""
    mods = {_module_name(p) for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        mod = _module_name(path)
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                up = base[: len(base) - (node.level - 1)] if node.level else []
                target = ".".join(up + ([node.module] if node.module else []))
                deps |= {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names}
        graph[mod] = {d for d in deps if d in mods and d != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


@pytest.mark.parametrize("graph,expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}}, [["a", "b", "c"], ["d", "e"]]),
])
def test_the_cycle_walk_itself(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


@pytest.mark.parametrize("room,other,expected", [("api", "service", True), ("state", "exec", True),
                                                 ("exec", "state", False), ("service", "api", False)])
def test_the_room_rule_itself(room: str, other: str, expected: bool) -> None:
    # a room may import a room below it, never one above
    assert (ROOM[other] <= ROOM[room]) is expected


def test_no_import_cycles_inside_runtime() -> None:
    # every import counts, those under TYPE_CHECKING too: a helper names a protocol of what it
    # uses of the service, never the service's module
    assert cycles(import_graph(RUNTIME)) == []
