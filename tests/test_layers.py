"""The import structure: the folders follow the pipeline, data flows one way (DESIGN.md, "Layout").

Every import of an emulator module by another, at the top or inside a function, is read from the
source with ``ast``: a module imports only from its own layer or the layers below it, no two modules
import each other (directly or round a longer circle), and no module takes a private name from
another.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "emulator"

# bottom to top (the and DESIGN.md's order); a module's layer is that of its longest prefix
LAYERS = [
    ("emulator.program", "emulator.block", "emulator.meta", "emulator.spans", "emulator.errors", "emulator.fingerprint",
     "emulator.printable", "emulator.docs_links"),
    ("emulator.scenario",),
    ("emulator.network", "emulator.devices", "emulator.importers"),
    ("emulator.workload", "emulator.engine", "emulator.folding", "emulator.faults", "emulator.memory",
     "emulator.metrics"),
    ("emulator.simulation",),
    ("emulator.outputs", "emulator.linkplot", "emulator.progress"),
    ("emulator.studies", "emulator.tools", "emulator.live"),
    ("emulator.cli", "emulator.__main__"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    best = (-1, -1)
    for i, names in enumerate(LAYERS):
        for name in names:
            if module == name or module.startswith(name + "."):
                best = max(best, (len(name), i))
    assert best[1] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def imports() -> dict[str, set[tuple[str, str]]]:
    """module → {(imported module, name taken from it or "")} for every emulator import in it."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[tuple[str, str]]] = {}
    for mod, path in modules.items():
        found: set[tuple[str, str]] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {(a.name, "") for a in node.names if a.name.startswith("emulator")}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("emulator"):
                assert node.level == 0, f"{mod}: relative import"
                for a in node.names:  # `from emulator.x import y` may name a module y or a name y
                    sub = f"{node.module}.{a.name}"
                    found.add((sub, "") if sub in modules else (node.module, a.name))
        out[mod] = {(m, n) for m, n in found if m != mod}
    return out


def test_every_import_goes_down_or_sideways():
    upward = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
              for m, targets in imports().items() for t, _ in targets if layer(t) > layer(m)]
    assert upward == []


def test_the_scenario_layer_imports_nothing_of_the_simulation():
    for mod, targets in imports().items():
        if mod.startswith("emulator.scenario"):
            assert {t for t, _ in targets if not t.startswith(("emulator.scenario", "emulator.errors"))} == set(), mod


def test_no_import_circles():
    graph = {m: {t for t, _ in targets} for m, targets in imports().items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                circles.append(path[path.index(t):] + [t] if t in path else [m, t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_no_private_names_cross_modules():
    taken = [f"{m} takes {name} from {t}" for m, targets in imports().items() for t, name in targets
             if name.startswith("_")]
    assert taken == []
