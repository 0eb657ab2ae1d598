"""Heavy third-party modules imported on first use (the bottom floor).

``from .._lazy import jax, jnp`` gives stand-ins for ``jax`` and ``jax.numpy`` that import the
real module when one of its attributes is first read, so a module that only *names* JAX at its
top (the experiments: their configs are read to print ``--help``) can be imported without it.
After the first read the stand-in holds the module's attributes itself, so later reads cost
what a plain module's do. Nothing is put in ``sys.modules``: ``import jax`` elsewhere is
unaffected, and ``"jax" in sys.modules`` still says whether JAX was loaded.
"""

from __future__ import annotations

import importlib
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
diffrax = LazyModule("diffrax")
eqx = LazyModule("equinox")
optax = LazyModule("optax")

__all__ = ["LazyModule", "diffrax", "eqx", "jax", "jnp", "optax"]
