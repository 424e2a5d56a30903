"""The import contract: the folders follow the pipeline, data flows one way (DESIGN.md, "Layout").

Every import of an emulator module by another, at the top or inside a function, is read from the
source with ``ast``. Two rules hold, and breaking either fails CI:
- each package's ``__init__`` docstring (and each top-level module's) says what it may import, on a
  ``May import:`` line; the code imports nothing else (``test_imports_are_what_each_docstring_allows``);
- those allowances follow the stages bottom to top (``LAYERS``): nothing may import a layer above
  its own, so a docstring cannot allow an import back up (``test_docstrings_allow_only_lower_layers``).
No two modules import each other (directly or round a longer circle), and no module takes a private
name from another.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "emulator"

# bottom to top: scenario → workload → network → run → outputs, as DESIGN.md's "Layout" orders them
LAYERS = [
    ("emulator.errors", "emulator.fingerprint", "emulator.meta"),
    ("emulator.program", "emulator.spans"),
    ("emulator.scenario",),
    ("emulator.network", "emulator.devices"),
    ("emulator.importers",),
    ("emulator.workload", "emulator.result"),
    ("emulator.run",),
    ("emulator.outputs",),
    ("emulator.studies", "emulator.tools", "emulator.live"),
    ("emulator.cli",),
    ("emulator.__main__",),
]
UNITS = [name for names in LAYERS for name in names]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The package or top-level module that ``module`` belongs to."""
    best = max((u for u in UNITS if module == u or module.startswith(u + ".")), key=len, default="")
    assert best, f"{module} belongs to no layer: add it to LAYERS and give it a 'May import:' line"
    return best


def layer(module: str) -> int:
    u = unit(module)
    return next(i for i, names in enumerate(LAYERS) if u in names)


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


def allowed(u: str) -> set[str]:
    """The units that ``u``'s docstring allows on its ``May import:`` paragraph (its own modules always)."""
    path = PACKAGE / (u.removeprefix("emulator.").replace(".", "/"))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    found = re.search(r"^May import:(.*?)(?:\n\s*\n|\Z)", doc, flags=re.S | re.M)
    assert found, f"{path.relative_to(ROOT)}: its docstring has no 'May import:' paragraph"
    text = found.group(1).split("Never")[0].split("never")[0]
    return {unit(name) for name in re.findall(r"emulator(?:\.\w+)+", text)} | {u}


def test_every_unit_says_what_it_may_import():
    for u in UNITS:
        assert allowed(u) >= {u}


def test_imports_are_what_each_docstring_allows():
    broken = sorted({f"{m} imports {t}, which {unit(m)}'s docstring does not allow"
                     for m, targets in imports().items() for t, _ in targets if unit(t) not in allowed(unit(m))})
    assert broken == []


def test_docstrings_allow_only_lower_layers():
    upward = [f"{u} (layer {layer(u)}) may import {a} (layer {layer(a)})"
              for u in UNITS for a in allowed(u) if a != u and layer(a) >= layer(u)]
    assert upward == []


def test_every_import_goes_down():
    upward = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
              for m, targets in imports().items() for t, _ in targets
              if unit(t) != unit(m) and layer(t) >= layer(m)]
    assert upward == []


def test_a_broken_contract_is_caught():
    """The check can fail: an import of the run stage from the scenario reader is outside its allowance."""
    reader = imports()["emulator.scenario.reader"] | {("emulator.run.engine", "")}
    assert [t for t, _ in reader if unit(t) not in allowed("emulator.scenario")] == ["emulator.run.engine"]


def test_top_level_holds_only_the_entry_points_and_the_bottom_layer():
    # the IR, its report facts, the records, the errors, the fingerprint and the Result record
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__", "cli"))
    assert top == ["errors", "fingerprint", "meta", "program", "result", "spans"]


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
