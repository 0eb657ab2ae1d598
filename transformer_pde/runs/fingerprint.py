"""The identity of a run: a SHA-256 over everything that determines it.

:func:`run_fingerprint` hashes arrays to the bit and functions by what they compute, not by
their name: the bytecode and constants of their code, the contents of their closure cells,
their defaults and the module-level values they read, recursively (a time-dependent ``V`` with
another closure constant, a ``SaveAt(fn=...)`` replaced by another, is another run). equinox
Modules and dataclasses are hashed field by field, static fields included. Library functions
(JAX, NumPy, equinox, this package) are identified by their qualified name. What cannot be
identified -- an object whose only description is its memory address -- is refused with a
``ValueError`` naming it, never hashed by something that would let another run resume it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import types

import jax
import numpy as np

_ADDRESS = " at 0x"


class _Fingerprint:
    """A SHA-256 over objects: arrays to the bit, functions by their code (bytecode, constants,
    names), closure cell contents, defaults and the globals they read, recursively; equinox
    Modules and dataclasses field by field (static fields included); containers item by item.
    What cannot be identified (an object whose repr is its address) is refused."""

    def __init__(self, closures: bool = False):
        self.h = hashlib.sha256()
        self.active: set[int] = set()  # objects on the path (recursive functions, cycles)
        # library functions by their closure cells and defaults too, not by name alone: a closure
        # made at run time (an experiment's statistic capturing a sample) is another program
        self.closures = closures

    def tag(self, s: str) -> None:
        self.h.update(s.encode())
        self.h.update(b"\0")

    def add(self, obj, where: str) -> None:
        if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
            self.tag(f"{type(obj).__name__}:{obj!r}")
            return
        if isinstance(obj, (jax.Array, np.ndarray, np.generic)):
            if isinstance(obj, jax.core.Tracer):
                raise ValueError(f"cannot fingerprint {where}: it is traced (call outside jit)")
            if jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
                obj = jax.random.key_data(obj)
            a = np.asarray(obj)
            if a.dtype == object:
                self.tag(f"objarray{a.shape}")
                for i, v in enumerate(a.ravel()):
                    self.add(v, f"{where}[{i}]")
                return
            self.tag(f"array:{a.dtype}{a.shape}")
            self.h.update(np.ascontiguousarray(a).tobytes())
            return
        key = id(obj)
        if key in self.active:  # a cycle (a recursive function reading its own name)
            self.tag(f"cycle:{type(obj).__qualname__}")
            return
        self.active.add(key)
        try:
            self._add_compound(obj, where)
        finally:
            self.active.discard(key)

    def _add_compound(self, obj, where):
        if isinstance(obj, (list, tuple)):
            self.tag(f"{type(obj).__qualname__}[{len(obj)}]")
            for i, v in enumerate(obj):
                self.add(v, f"{where}[{i}]")
            return
        if isinstance(obj, dict):
            self.tag(f"{type(obj).__qualname__}{{{len(obj)}}}")
            for k in sorted(obj, key=repr):
                self.add(k, f"{where} key")
                self.add(obj[k], f"{where}[{k!r}]")
            return
        if isinstance(obj, (set, frozenset)):
            self.tag(f"set{{{len(obj)}}}")
            for v in sorted(obj, key=repr):
                self.add(v, f"{where} item")
            return
        if isinstance(obj, type):
            self.tag(f"class:{obj.__module__}.{obj.__qualname__}")
            return
        if isinstance(obj, types.ModuleType):
            self.tag(f"module:{obj.__name__}")
            return
        if isinstance(obj, types.CodeType):
            self._add_code(obj, where)
            return
        if isinstance(obj, types.FunctionType):
            self._add_function(obj, where)
            return
        if isinstance(obj, types.MethodType):
            self.tag("method")
            self.add(obj.__func__, f"{where}.__func__")
            self.add(obj.__self__, f"{where}.__self__")
            return
        if isinstance(obj, functools.partial):
            self.tag("partial")
            self.add(obj.func, f"{where}.func")
            self.add(obj.args, f"{where}.args")
            self.add(obj.keywords, f"{where}.keywords")
            return
        if isinstance(obj, (types.BuiltinFunctionType, np.ufunc)):
            self.tag(f"builtin:{type(obj).__qualname__}:{obj.__module__}.{obj.__name__}")
            return
        if dataclasses.is_dataclass(obj):  # equinox Modules (parameters and static fields)
            self.tag(f"dataclass:{type(obj).__module__}.{type(obj).__qualname__}")
            for field in dataclasses.fields(obj):
                self.tag(field.name)
                self.add(getattr(obj, field.name, _MISSING), f"{where}.{field.name}")
            return
        if obj is _MISSING:
            self.tag("missing")
            return
        leaves, treedef = jax.tree_util.tree_flatten(obj)
        if not (len(leaves) == 1 and leaves[0] is obj):  # a registered pytree (jax Partial, ...)
            self.tag(f"pytree:{treedef}")
            for i, v in enumerate(leaves):
                self.add(v, f"{where} leaf {i}")
            return
        target = inspect.unwrap(obj) if callable(obj) else obj
        if target is not obj:  # jax.jit, custom_jvp, functools.wraps: hash what they wrap
            self.tag(f"wrapper:{type(obj).__qualname__}")
            self.add(target, f"{where} (wrapped)")
            return
        text = repr(obj)
        if _ADDRESS in text:
            raise ValueError(
                f"cannot fingerprint {where} ({type(obj).__qualname__}): its repr is its memory address, "
                f"so a resumed run could not tell it from another; pass a plain function, an "
                f"equinox Module or arrays instead")
        self.tag(f"{type(obj).__module__}.{type(obj).__qualname__}:{text}")

    def _add_code(self, code, where):
        self.tag(f"code:{code.co_name}:{code.co_argcount}:{code.co_kwonlyargcount}:{code.co_flags}")
        self.h.update(code.co_code)
        self.tag(repr(code.co_names) + repr(code.co_varnames) + repr(code.co_freevars))
        for c in code.co_consts:
            self.add(c, f"{where} constant")

    def _add_function(self, fn, where):
        name = f"{fn.__module__}.{fn.__qualname__}"
        self.tag(f"function:{name}")
        if str(fn.__module__).split(".")[0] in _LIBRARIES:
            # library code: its name (and the versions in metadata.json) identify it
            if self.closures:
                wrapped = inspect.unwrap(fn)
                if wrapped is not fn:  # a decorator's wrapper (a runtime type checker): what it wraps
                    self.add(wrapped, f"{name} (wrapped)")
                else:
                    # its code too: two lambdas of one function share a name
                    self._add_code(fn.__code__, name)
                    self._add_cells(fn, name)
            return
        self._add_code(fn.__code__, name)
        self._add_cells(fn, name)
        # the globals the code reads (a module-level constant changed between runs)
        for gname in sorted(_global_names(fn.__code__)):
            if gname in fn.__globals__:
                self.tag(f"global:{gname}")
                self.add(fn.__globals__[gname], f"{name} global {gname!r}")

    def _add_cells(self, fn, name):
        """A function's defaults and closure cells (what a function made at run time holds)."""
        self.add(fn.__defaults__, f"{name} defaults")
        self.add(fn.__kwdefaults__, f"{name} keyword defaults")
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (a name not yet bound)
                value = _MISSING
            self.tag(f"free:{var}")
            self.add(value, f"{name} closure variable {var!r}")


_MISSING = object()


def _global_names(code) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


_LIBRARIES = {"jax", "jaxlib", "numpy", "equinox", "diffrax", "optax", "ott", "lineax", "optimistix",
              "transformer_pde", "scipy", "math", "builtins", "functools", "operator"}


def run_fingerprint(*objects, **named) -> str:
    """SHA-256 (hex) of ``objects``: arrays to the bit (dtype, shape, bytes), functions by code,
    closures, defaults and globals read, Modules field by field (module docstring). Raises
    ``ValueError`` naming what cannot be identified."""
    fp = _Fingerprint()
    for i, obj in enumerate(objects):
        fp.add(obj, f"argument {i}")
    for name in sorted(named):
        fp.tag(f"named:{name}")
        fp.add(named[name], name)
    return fp.h.hexdigest()


__all__ = ["run_fingerprint"]
