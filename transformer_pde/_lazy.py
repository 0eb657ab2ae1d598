"""Heavy third-party modules imported on first use (the bottom floor).

``from ._lazy import eqx, jax, jnp`` gives stand-ins for ``equinox``, ``jax`` and ``jax.numpy`` that
import the real module when one of its attributes is first read, so a bottom-floor module that only
*names* JAX at its top (``_checks``, which the experiments' options read to print ``--help``) can be
imported without it. The experiments import JAX plainly: their entries (``experiments/configs/``)
are what ``list`` and ``--help`` read.
After the first read the stand-in holds the module's attributes itself, so later reads cost
what a plain module's do. Nothing is put in ``sys.modules``: ``import jax`` elsewhere is
unaffected, and ``"jax" in sys.modules`` still says whether JAX was loaded.

A package's public names may be one stub file, ``__init__.pyi`` (lines ``from .mod import Name as
Name``): :func:`attach_stub` makes the package import ``mod`` when ``Name`` is first read, and
:func:`stub_exports` reads the names without importing anything (``transformer_pde`` re-exports the
models' names so).
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import types


class LazyModule(types.ModuleType):
    """The module ``name``, imported when an attribute is first read from this stand-in."""

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__name__)
        self.__dict__.update(vars(module))  # later reads find the attributes without this method
        return getattr(module, attr)  # a name the module itself provides lazily (PEP 562)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


jax = LazyModule("jax")
jnp = LazyModule("jax.numpy")
eqx = LazyModule("equinox")



def stub_exports(init_file: str) -> dict[str, tuple[str, str | None]]:
    """The names the stub ``__init__.pyi`` beside ``init_file`` exports: name -> (the module that
    defines it, relative to the package, and its attribute there; None: the name is that
    submodule). Read without importing anything."""
    with open(os.path.splitext(init_file)[0] + ".pyi", encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = {}
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.level == 1):
            continue
        for alias in node.names:
            name = alias.asname or alias.name
            out[name] = (f".{node.module}", alias.name) if node.module else (f".{alias.name}", None)
    return out


def attach_stub(package: str, init_file: str):
    """``(__getattr__, __dir__, __all__)`` for the package ``package`` (its ``__init__.py`` is
    ``init_file``): every name of its stub (:func:`stub_exports`) imported on first access (PEP 562)."""
    exports = stub_exports(init_file)

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = exports[name]
        value = importlib.import_module(module, package)
        if attr is not None:
            value = getattr(value, attr)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__, sorted(exports)


__all__ = ["LazyModule", "attach_stub", "eqx", "jax", "jnp", "stub_exports"]
