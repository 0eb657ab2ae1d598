"""An experiment's own jitted function, its program kept between processes like a solve's.

``tp.solve`` keeps its program when it is called on concrete inputs inside
:func:`~transformer_pde.runs.kept_programs`; a solve inside a function the experiment jits or
vmaps itself is traced as part of that function, so it is the function's program that must be
kept. :class:`Kept` is that function: ``eqx.filter_jit(fn)``, run through
:func:`~transformer_pde.runs.call_kept` inside ``kept_programs`` (traced once, exported beside
the compile cache, loaded by a later process instead of traced).

``fn`` must be a plain function (a ``def`` or a ``lambda``): its key is what it computes (its
code, or for this package's functions its name and the package source, and its closure cells,
defaults and globals, recursively). A ``jax.vmap`` or ``jax.jit`` of a function is refused:
the key would see the function it wraps but not how it maps it (``in_axes``); written in a
``def``, the mapping is in the code the key hashes.
"""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Callable

import equinox as eqx
import jax

from .._programs import run_program


class Kept(eqx.Module):
    """``eqx.filter_jit(fn)`` (arrays traced, the rest static), whose program is kept inside
    :func:`~transformer_pde.runs.kept_programs` (see the module docstring); outside it, or where
    the program cannot be kept (a host callback, arguments traced by a caller's ``jit``), it is
    ``eqx.filter_jit(fn)`` itself, so a runtime check in ``fn`` still raises."""

    fn: Callable
    jitted: Callable

    def __init__(self, fn):
        if not isinstance(fn, types.FunctionType) or _transformed(fn):
            raise ValueError(f"kept: fn must be a plain function (a def or a lambda; put a jax.vmap or "
                             f"jax.jit of one inside a def, whose code then says how it maps), got "
                             f"{type(fn).__name__} {fn!r}"[:300])
        self.fn = fn
        self.jitted = eqx.filter_jit(fn)

    def __call__(self, *args):
        return run_program(self.fn, self.jitted, args)


def _transformed(fn) -> bool:
    """Whether ``fn`` is a JAX or Equinox transform of a function (``jax.vmap``, ``jax.jit``,
    ``eqx.filter_jit``, ...: wrapper code of those libraries); a type checker's wrapper (the
    jaxtyping hook of the tests) is not, and is keyed by its code and what it wraps."""
    import equinox

    roots = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, equinox))

    def transform(layer) -> bool:
        return not isinstance(layer, types.FunctionType) or layer.__code__.co_filename.startswith(roots)

    return transform(inspect.unwrap(fn, stop=transform))


def kept(fn) -> Kept:
    """``fn`` as :class:`Kept`: ``eqx.filter_jit(fn)`` whose program
    :func:`~transformer_pde.runs.kept_programs` keeps between processes. Usable as a decorator."""
    return Kept(fn)


__all__ = ["Kept", "kept"]
