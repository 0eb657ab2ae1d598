"""tp.diagnostics loads a name's module on first use: the stub __init__.pyi lists what each module's
__all__ exports, and reading one name imports that module only."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import transformer_pde.diagnostics as diagnostics
from transformer_pde._lazy import stub_exports


def test_the_stub_lists_every_modules_exports_and_nothing_else():
    stub = stub_exports(diagnostics.__file__)
    modules = sorted(m.name for m in pkgutil.iter_modules(diagnostics.__path__) if not m.name.startswith("_"))
    assert sorted(n for n, (_, attr) in stub.items() if attr is None) == modules
    for name in modules:
        module = importlib.import_module(f"transformer_pde.diagnostics.{name}")
        listed = sorted(n for n, (where, attr) in stub.items() if attr is not None and where == f".{name}")
        assert listed == sorted(module.__all__), name
    for name, (where, attr) in stub.items():
        if attr is not None:
            module = importlib.import_module(where, "transformer_pde.diagnostics")
            assert getattr(diagnostics, name) is getattr(module, attr)


def test_a_kde_count_imports_no_model():
    """The KDE's modes (kde-modes' second run) import neither the models nor the other diagnostics."""
    code = ("import sys, numpy as np, transformer_pde as tp; "
            "print(tp.diagnostics.kde_modes(np.linspace(-1, 1, 50), 30.0)); "
            "print(sorted(m for m in sys.modules if m.startswith(('transformer_pde.models', "
            "'transformer_pde.diagnostics.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    count, modules = out.stdout.strip().splitlines()
    assert int(count) >= 1
    assert modules == "['transformer_pde.diagnostics.kde']"
