"""The house is built in layers (docs/architecture.md): the import graph has no cycles, rooms
import only rooms below them, no experiment defines a dynamics, capabilities are types."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "transformer_pde"

# rooms, lowest first; a module may import its own room and rooms listed before it
LAYERS = [
    {"_types", "_checks", "_io", "_lazy", "_linalg", "_programs", "params"},
    {"kernels"},
    {"models"},
    {"solvers"},
    {"measures", "stationary"},
    {"diagnostics", "theory"},
    {"sweeps", "fitting", "convergence", "statistics", "plot"},
    {"runs"},
    {"experiments"},
    {"cli"},
]
RANK = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _modules():
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = ("transformer_pde",) + p.relative_to(PKG).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _edges(mods):
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[m] |= {t for t in targets if t in mods and t != m and not m.startswith(t + ".")}
    return edges


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_import_graph_has_no_cycles():
    mods = _modules()
    edges = _edges(mods)
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(mods):
        if m not in state:
            visit(m, [m])


def test_rooms_import_only_rooms_below():
    mods = _modules()
    bad = []
    for m, targets in _edges(mods).items():
        if m == "transformer_pde":
            continue  # the package root re-exports every room
        for t in targets:
            a, b = _room(m), _room(t)
            if b and RANK[b] > RANK[a]:
                bad.append(f"{m} ({a}) imports {t} ({b})")
    assert not bad, "\n".join(bad)


def test_every_module_is_in_a_room():
    rooms = {_room(m) for m in _modules()} - {""}
    assert rooms <= set(RANK), rooms - set(RANK)


def test_no_experiment_defines_a_dynamics():
    for p in (PKG / "experiments").glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                assert not any("Dynamics" in b or "Attention" in b or "Module" in b for b in bases), (
                    f"{p.name} defines {node.name}({', '.join(bases)}): dynamics live in models/")


def test_experiments_share_through_common_not_each_other():
    """An experiment imports the library, the experiments' private helpers (``_common``,
    ``_options``, ...) and its own entry (``configs/<name>``), never another experiment or entry."""
    pkg = "transformer_pde.experiments."
    entries = pkg + "configs."
    public = lambda m: m.startswith(pkg) and not m[len(pkg):].startswith("_")  # noqa: E731
    own_entry = lambda m, t: t == entries + m[len(pkg):]  # noqa: E731
    bad = [f"{m} imports {t}" for m, targets in _edges(_modules()).items() if public(m)
           for t in sorted(targets) if public(t) and not own_entry(m, t) and t != entries[:-1]]
    assert not bad, "\n".join(bad)


def test_experiment_entries_import_no_computation():
    """An entry (``experiments/configs/<name>.py``) imports only light modules: no JAX and no
    experiment's computation, so ``list`` and ``--help`` read every entry without loading them."""
    heavy = ("jax", "jaxlib", "equinox", "diffrax", "optax", "ott", "jax_finufft", "matplotlib", "xarray")
    for p in sorted((PKG / "experiments" / "configs").glob("[a-z]*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
                assert node.level != 1 or node.module is None, f"{p.name} imports another entry"
            else:
                continue
            assert not [n for n in names if n.split(".")[0] in heavy], f"{p.name} imports {names}"


def test_no_attribute_sniffing_of_models():
    """Capabilities are types: no hasattr/getattr on dynamics or attention objects."""
    offenders = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "hasattr", "getattr"):
                target = ast.unparse(node.args[0]) if node.args else ""
                if any(w in target for w in ("attn", "dyn", "model", "block", "self.dynamics")):
                    offenders.append(f"{p.relative_to(PKG)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.slow
def test_importing_the_library_does_not_import_experiments():
    code = ("import sys, transformer_pde as tp; import transformer_pde.models, transformer_pde.solvers; "
            "print(any(m.startswith('transformer_pde.experiments') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_package_imports_lazily_and_exports_every_model():
    """``import transformer_pde`` loads no submodule but its lazy loader (``_lazy``: it reads the
    models' names from their stub) and no JAX (the CLI prints text without them); ``tp.X`` loads
    X's module on first use, and every name of models.__all__ is one of tp's."""
    code = ("import sys, transformer_pde as tp; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('jax', 'numpy', 'diffrax', 'equinox') or m.startswith('transformer_pde.') "
            "and m != 'transformer_pde._lazy'); print(heavy); "
            "tp.SoftmaxAttention; print('jax' in sys.modules, 'transformer_pde.models' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True True"], out.stdout
    import transformer_pde as tp

    assert set(tp.models.__all__) <= set(tp.__all__)
    assert set(dir(tp)) >= set(tp.__all__)


def test_module_names_are_not_shadowed():
    import transformer_pde as tp

    for name in ("solvers", "sweeps", "fitting", "convergence", "statistics", "diagnostics", "theory",
                 "models", "kernels", "measures", "stationary"):
        assert type(getattr(tp, name)).__name__ == "module", name
    assert callable(tp.sweeps.first_time) and callable(tp.solvers.layers)


def test_every_exported_name_exists():
    """``from transformer_pde.X import *`` works for every module: each name in an ``__all__``
    is defined (a stale name makes the star import raise)."""
    import importlib

    missing = []
    for name in sorted(_modules()):
        mod = importlib.import_module(name)
        missing += [f"{name}.{n}" for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)]
    assert not missing, missing


EXPERIMENT_HELPERS = {"_base", "_common", "_options", "_progress"}
"""The experiments room's own helpers (private to the room, shared by its modules)."""
THIRD_PARTY_ONLY = {"_lazy"}
"""A private module of the library that only re-exports third-party modules (jax, diffrax, ...)
lazily: importing it reaches no library internals."""


def test_experiments_use_only_public_names_of_the_library():
    """An experiment is a user of the library: it imports no ``_``-prefixed module or name of it
    (issue 36), other than the experiments room's own helpers and the lazy third-party imports."""
    found = []
    for path in sorted((PKG / "experiments").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("transformer_pde")]
                found += [(path.name, node.lineno, n) for n in names
                          if any(part.startswith("_") for part in n.split("."))]
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("transformer_pde"):
                continue
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 0:
                parts = parts[1:]
            elif node.level == 1 and parts[:1] and parts[0] in EXPERIMENT_HELPERS:
                continue
            elif node.level == 1:
                parts = ["experiments", *parts]
            private = [p for p in parts if p.startswith("_") and p not in THIRD_PARTY_ONLY]
            private += [a.name for a in node.names if a.name.startswith("_")]
            if private:
                found.append((path.name, node.lineno, f"{'.' * node.level}{node.module or ''}: {private}"))
    assert not found, f"experiments importing private names of the library: {found}"
