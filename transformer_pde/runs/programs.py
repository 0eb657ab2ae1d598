"""Traced programs kept on disk beside the compile cache: a second run neither traces nor compiles.

JAX's persistent compilation cache (:mod:`.compile_cache`) skips XLA, not tracing: a small
experiment still traces for about half a second in every process. :func:`lower_program` keeps
the traced program itself (its StableHLO, serialized by ``jax.export``) under a key naming
everything tracing reads, and a later process with the same key loads it instead of tracing:

* the program: the function by what it computes and its static arguments (an experiment's
  frozen config), both by the rules of the checkpoint fingerprint
  (:func:`~transformer_pde.runs.run_fingerprint`: code, constants, closure cells, defaults and
  the globals it reads, recursively; arrays to the bit; dataclasses field by field), and the
  shapes and dtypes of its array arguments; a function edited and run again in one process (a
  notebook cell) or two scripts' ``__main__.f`` are other programs;
* the code it traces: this package's source (every ``.py`` file, hashed) and the versions of
  JAX, jaxlib and the libraries the package traces through;
* JAX's configuration (``jax.config.values``: x64, matmul precision, PRNG, ...), the
  ``EQX_*`` environment variables (Equinox reads them when tracing) and the platform.

Both runs compile and run the exported program (the first exports, then calls it), so their
numbers are the same bits. Not seen: a dependency edited in place without a new version (remove
``<cache>/programs``, or run with ``--compile-cache off``). Programs are kept when JAX's compilation cache is on (the CLI turns
it on; ``--compile-cache off`` turns both off), in ``<cache>/programs``, written atomically.
Each file carries its key and the SHA-256 of its payload, both checked when it is loaded: a
file copied over another key's, edited, truncated or not a regular file is never run; it is
traced again and replaced. A program holding a host callback (a runtime
check, ``eqx.error_if``) cannot be serialized: it is lowered as before and not kept, as JAX's
compilation cache does not keep its executable.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import stat
import sys
import tempfile
import types
from pathlib import Path

__all__ = ["finite_by_construction", "lower_program", "program_dir", "program_key", "unit_row_tolerance",
           "unit_rows_by_construction"]

TRACED_THROUGH = ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "lineax", "ott-jax",
                  "jax-finufft", "numpy")
"""The distributions whose code a traced program of this package can hold."""


@functools.cache
def _source_digest() -> str:
    """SHA-256 of this package's Python source, path by path (about 5 ms, once per process)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def program_key(fn, static: tuple, args: tuple) -> str:
    """The key a program is kept under (see the module docstring): ``fn`` a Python function and
    ``static`` what :func:`~transformer_pde.runs.run_fingerprint` can identify (else a
    ValueError naming ``lower_program`` and the value), ``args`` arrays or ShapeDtypeStructs."""
    import jax
    import numpy as np

    from .fingerprint import run_fingerprint

    if not isinstance(fn, types.FunctionType):
        raise ValueError(f"lower_program: fn must be a Python function, got {type(fn).__name__} "
                         f"{fn!r}"[:300])
    if not isinstance(static, tuple):
        raise ValueError(f"lower_program: static must be a tuple (the arguments not traced), got "
                         f"{type(static).__name__} {static!r}"[:300])
    if not isinstance(args, tuple) or not all(
            isinstance(a, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) for a in args):
        raise ValueError(f"lower_program: args must be a tuple of arrays or jax.ShapeDtypeStruct, got "
                         f"{args!r}"[:300])
    name = f"{fn.__module__}.{fn.__qualname__}"
    try:
        identity = run_fingerprint(fn=fn, static=static)
    except ValueError as e:
        raise ValueError(f"lower_program cannot key the program {name}: {e}") from None
    parts = [
        name, identity,
        repr([(tuple(a.shape), str(a.dtype), bool(getattr(a, "weak_type", False))) for a in args]),
        _source_digest(),
        repr([(d, _version(d)) for d in TRACED_THROUGH]), sys.version.split()[0],
        repr(sorted((k, repr(v)) for k, v in jax.config.values.items())),
        repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("EQX_"))),
        jax.default_backend(), repr(sorted({d.device_kind for d in jax.devices()})),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def finite_by_construction(arrays) -> None:
    """Mark traced ``arrays`` (a list) as finite by construction, or as ones whose NaN or inf the
    program reports itself (as a value, checked after it runs): the library's runtime finiteness
    check (a host callback, which keeps a program out of :func:`lower_program`'s store and out
    of JAX's compilation cache) passes them through. An array derived from them is checked as
    usual. Call it while tracing, inside the program."""
    from .._checks import cover_finiteness

    if not isinstance(arrays, (list, tuple)):
        raise ValueError(f"finite_by_construction: arrays must be a list of traced arrays, got "
                         f"{type(arrays).__name__}"[:300])
    cover_finiteness(list(arrays))


def unit_rows_by_construction(x):
    """Mark traced tokens ``x`` as unit rows by construction (checked, within
    :func:`unit_row_tolerance`, before the program runs): the sphere's runtime check of
    |x_i| = 1 passes them through. Returns ``x``."""
    from .._checks import mark_unit_rows

    return mark_unit_rows(x)


def unit_row_tolerance(dtype) -> float:
    """How far |x_i| may be from 1 for tokens the sphere takes as unit rows, in ``dtype``: 1e-6
    in float64, 1e-3 in float32 (what a check before a program marking unit rows must meet)."""
    from .._checks import unit_tolerance

    return unit_tolerance(dtype)


def program_dir() -> Path | None:
    """``<compile cache>/programs``, or None when JAX's compilation cache is off."""
    import jax

    cache = jax.config.values.get("jax_compilation_cache_dir")
    return Path(cache) / "programs" if cache else None


def lower_program(fn, static: tuple = (), args: tuple = (), *, compiler_options=None):
    """``jax.stages.Lowered`` of ``fn(*static, *args)`` (``static`` hashable, not traced),
    through the program kept on disk under :func:`program_key` when there is one; else traced,
    exported, kept, then lowered from the export (so every run runs the same program). A later
    call in the same process returns the same ``Lowered``, whose ``compile()`` reuses its
    executable."""
    if compiler_options is not None and not isinstance(compiler_options, dict):
        raise ValueError(f"lower_program: compiler_options must be a dict of XLA options or None, got "
                         f"{compiler_options!r}"[:300])
    memo = (program_key(fn, static, args), repr(sorted((compiler_options or {}).items())))
    if memo not in _LOWERED:
        _LOWERED[memo] = _lower(fn, static, args, memo[0], compiler_options)
        while len(_LOWERED) > _KEEP_LOWERED:
            del _LOWERED[next(iter(_LOWERED))]
    return _LOWERED[memo]


_LOWERED: dict = {}
"""The programs this process lowered, by key and compiler options (oldest first)."""
_KEEP_LOWERED = 32


def _lower(fn, static, args, key, compiler_options):
    import jax

    jit = functools.partial(jax.jit, compiler_options=compiler_options)
    directory = program_dir()
    if directory is not None:
        path = directory / f"{fn.__name__}-{key}.jaxexport"
        exported = _load(path, key)
        if exported is None:
            try:
                exported = jax.export.export(jax.jit(functools.partial(fn, *static)))(*args)
            except NotImplementedError as e:  # a host callback (a runtime check) cannot be serialized
                if "host_callbacks" not in str(e):
                    raise
            else:
                _save(path, key, exported.serialize())
        if exported is not None:
            return jit(exported.call).trace(*args).lower()
    return jit(fn, static_argnums=tuple(range(len(static)))).trace(*static, *args).lower()


MAGIC = b"transformer-pde program 1\n"
"""The first line of a kept program; the key and the payload's SHA-256 follow, a line each."""


def _load(path: Path, key: str):
    """The program kept at ``path`` if it is a regular file written under ``key`` whose payload
    hashes as it says (else None: it is traced again and replaced)."""
    import jax

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the run
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    header = len(MAGIC) + 2 * 65
    if len(data) < header or not data.startswith(MAGIC):
        return None
    stored_key, digest = data[len(MAGIC):header].decode("ascii", "replace").split("\n")[:2]
    payload = data[header:]
    if stored_key != key or digest != hashlib.sha256(payload).hexdigest():
        return None
    try:
        return jax.export.deserialize(bytearray(payload))
    except Exception:  # noqa: BLE001 - a payload this version cannot read is traced again
        return None


def _save(path: Path, key: str, payload: bytes | bytearray) -> None:
    """Write atomically (a reader sees the whole file or none), with its key and the payload's
    SHA-256 in front; a run never fails for its cache."""
    payload = bytes(payload)
    data = MAGIC + f"{key}\n{hashlib.sha256(payload).hexdigest()}\n".encode() + payload
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
