"""Every public name has a page on the documentation site, and a docstring.

The public names are ``tp.__all__`` and the ``__all__`` of the public subpackages (their
submodules with an ``__all__`` of their own included; a subpackage without ``__all__`` exports the
names it defines). A name is on the site when some ``::: dotted.path`` block of ``docs/**/*.md``
(mkdocstrings) resolves to the same object (a re-export documented once is enough). The experiment
list (``experiments.md``) is generated from the registry at build time by
``docs/_hooks/experiments.py``; checked here to hold every experiment and its options.
No MkDocs needed: the site's own build (``mkdocs build --strict``) is in ``.ci/run``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import re
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "transformer_pde"

#: the public subpackages (``tp.params`` is private: only ``tp.PiecewiseConstant`` is exported)
PUBLIC = ("transformer_pde", "transformer_pde.models", "transformer_pde.kernels", "transformer_pde.solvers",
          "transformer_pde.measures", "transformer_pde.stationary",
          "transformer_pde.diagnostics", "transformer_pde.theory", "transformer_pde.convergence",
          "transformer_pde.runs", "transformer_pde.sweeps", "transformer_pde.statistics", "transformer_pde.fitting",
          "transformer_pde.plot", "transformer_pde.experiments")


def _exports(mod: types.ModuleType) -> list[str]:
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return [n for n, v in vars(mod).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == mod.__name__]


@functools.cache
def public_names() -> dict[str, object]:
    """dotted path -> object, for every public name (modules excluded: their names are listed)."""
    out: dict[str, object] = {}
    queue, seen = list(PUBLIC), set()
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        mod = importlib.import_module(name)
        for n in _exports(mod):
            obj = getattr(mod, n)
            if isinstance(obj, types.ModuleType):
                if obj.__name__.startswith("transformer_pde.") and hasattr(obj, "__all__"):
                    queue.append(obj.__name__)
                continue
            out.setdefault(f"{name}.{n}", obj)
    return out


def documented_paths() -> list[str]:
    """The ``::: path`` blocks of the site's Markdown pages."""
    paths = []
    for md in sorted(DOCS.rglob("*.md")):
        paths += re.findall(r"^:::\s+([\w.]+)", md.read_text(encoding="utf-8"), flags=re.M)
    return paths


def resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _is_code(obj) -> bool:
    return isinstance(obj, type) or callable(obj)


def _same(path: str, obj, doc_path: str, doc_obj) -> bool:
    """The same object (a constant also under the same name: small ints are shared objects)."""
    return obj is doc_obj and (_is_code(obj) or path.rsplit(".", 1)[1] == doc_path.rsplit(".", 1)[1])


def test_every_reference_block_resolves():
    bad = []
    for path in documented_paths():
        try:
            resolve(path)
        except (ImportError, AttributeError) as e:
            bad.append(f"{path}: {e}")
    assert not bad, "::: blocks that name nothing:\n" + "\n".join(bad)


def test_every_public_name_has_a_reference_page():
    documented = documented_paths()
    objs = [(p, resolve(p)) for p in documented]
    missing = [path for path, obj in public_names().items()
               if path not in documented and not any(_same(path, obj, p, o) for p, o in objs)]
    assert not missing, ("public names with no `::: path` block in docs/api/*.md (add each to the page "
                         "of its role):\n" + "\n".join(missing))


@functools.cache
def _source_trees() -> tuple:
    return tuple(ast.parse(f.read_text(encoding="utf-8")) for f in sorted(PACKAGE.rglob("*.py")))


def _constant_documented(name: str) -> bool:
    """A module-level constant has a docstring: a string literal right after its assignment."""
    for tree in _source_trees():
        for stmt, nxt in zip(tree.body, tree.body[1:]):
            targets = (stmt.targets if isinstance(stmt, ast.Assign)
                       else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str) and nxt.value.value.strip()):
                    return True
    return False


def _own_docstring(obj) -> str:
    if isinstance(obj, type):
        doc = obj.__dict__.get("__doc__") or ""
        if dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""  # the signature a dataclass writes for a class with no docstring
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def test_every_public_name_has_a_docstring():
    missing = []
    for path, obj in public_names().items():
        if _is_code(obj):
            if not _own_docstring(obj):
                missing.append(path)
        elif not _constant_documented(path.rsplit(".", 1)[1]):
            missing.append(f"{path} (a constant: a string literal under its assignment)")
    assert not missing, "public names with no docstring:\n" + "\n".join(missing)


def _experiments_hook():
    spec = importlib.util.spec_from_file_location("docs_experiments_hook", DOCS / "_hooks" / "experiments.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_experiment_list_has_every_experiment_and_option():
    from transformer_pde.experiments import REGISTRY

    page = _experiments_hook().experiments_page()
    for name, exp in REGISTRY.items():
        m = re.search(rf"^## {re.escape(name)} \{{#[\w-]+\}}$(.*?)(?=^## |\Z)", page, flags=re.M | re.S)
        assert m, f"experiment {name!r} has no section on the experiment list"
        for f in dataclasses.fields(exp.config):
            assert f"`--{f.name.replace('_', '-')}`" in m.group(1), f"{name}: option {f.name} not listed"


def test_nav_pages_exist():
    """Every page the site's nav names exists, but the generated one (mkdocs --strict checks this too)."""
    nav = re.findall(r":\s+([\w/]+\.(?:md|ipynb))\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    for section in ("api/", "math/", "tutorials/"):
        assert any(p.startswith(section) for p in nav), f"no {section} pages in the nav"
    generated = _experiments_hook().PAGE
    assert generated in nav
    assert all((DOCS / p).exists() for p in nav if p != generated), [p for p in nav if not (DOCS / p).exists()]
