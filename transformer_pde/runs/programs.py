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
traced again and replaced. A program's runtime checks (``eqx.error_if``, host callbacks, which
neither ``jax.export`` nor JAX's compilation cache can keep) are traced as values
(:func:`~transformer_pde._checks.checks_as_values`): the program reports the first that failed,
and its compiled form raises it after running, with the check's own message
(``eqx.EquinoxRuntimeError``); the messages are kept with the program.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import stat
import sys
import tempfile
import types
from pathlib import Path

__all__ = ["LoweredProgram", "call_kept", "finite_by_construction", "kept_programs", "lower_program", "program_dir", "program_key", "unit_row_tolerance",
           "unit_rows_by_construction"]

_LIBRARY_ROOTS = {"jax", "jaxlib", "numpy", "equinox", "diffrax", "optax", "ott", "lineax", "optimistix",
                  "transformer_pde", "scipy", "functools", "operator"}
"""The libraries whose functions the checkpoint fingerprint names only; a program's key reads their
closures too."""

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
        identity = _program_fingerprint(fn=fn, static=static)
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


def _program_fingerprint(**named) -> str:
    """:func:`~transformer_pde.runs.run_fingerprint`, stricter where a program could be taken for
    another: a library function made at run time (a closure of this package, diffrax, ...) is
    identified by its closure's contents too, not by its name alone."""
    from .fingerprint import _Fingerprint

    class Strict(_Fingerprint):
        def _add_function(self, fn, where):
            super()._add_function(fn, where)
            library = str(fn.__module__).split(".")[0] in _LIBRARY_ROOTS
            if library and isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
                self.add(fn.__wrapped__, f"{where} (wrapped)")  # a decorator's wrapper (runtime type checks)
            elif library and fn.__closure__:
                for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                    try:
                        value = cell.cell_contents
                    except ValueError:  # an empty cell (a name not yet bound)
                        continue
                    self.tag(f"free:{var}")
                    self.add(value, f"{where} closure variable {var!r}")

    fp = Strict()
    for name in sorted(named):
        fp.tag(f"named:{name}")
        fp.add(named[name], name)
    return fp.h.hexdigest()


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


class LoweredProgram:
    """A program lowered by :func:`lower_program`, its checks traced as values: ``compile()``
    gives a function of the program's arguments that runs it and raises the first check that
    failed (``eqx.EquinoxRuntimeError`` with the check's message), else returns its outputs.

    Attributes:
        lowered: the ``jax.stages.Lowered`` program; it returns ``(code, outputs)``, ``code`` the
            index in ``messages`` of the check that failed (-1: none).
        messages: the program's checks' messages.
    """

    def __init__(self, lowered, messages: tuple[str, ...]):
        self.lowered = lowered
        self.messages = tuple(messages)

    def compile(self):
        from .._checks import raise_failed_check

        compiled, messages = self.lowered.compile(), self.messages

        def run(*args):
            code, out = compiled(*args)
            return raise_failed_check(code, messages, out)

        return run


def lower_program(fn, static: tuple = (), args: tuple = (), *, compiler_options=None) -> LoweredProgram:
    """:class:`LoweredProgram` of ``fn(*static, *args)`` (``static`` hashable, not traced), through
    the program kept on disk under :func:`program_key` when there is one; else traced (its checks
    as values), exported, kept, then lowered from the export (so every run runs the same program).
    A later call in the same process returns the same object, whose ``compile()`` reuses its
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


def _lower(fn, static, args, key, compiler_options) -> LoweredProgram:
    import jax

    from .._checks import checks_as_values

    jit = functools.partial(jax.jit, compiler_options=compiler_options)
    messages: list = []
    program = checks_as_values(functools.partial(fn, *static), messages)
    directory = program_dir()
    if directory is not None:
        path = directory / f"{fn.__name__}-{key}.jaxexport"
        kept = _load(path, key)
        if kept is not None:
            kept = None if _messages(kept[1]) is None else (kept[0], _messages(kept[1]))
        if kept is None:
            try:
                exported = jax.export.export(jax.jit(program))(*args)
            except NotImplementedError as e:  # a host callback left (a check not made to raise)
                if "host_callbacks" not in str(e):
                    raise
            else:
                kept = exported, tuple(messages)
                _save(path, key, json.dumps(kept[1]).encode() + b"\n" + exported.serialize())
        if kept is not None:
            return LoweredProgram(jit(kept[0].call).trace(*args).lower(), kept[1])
    lowered = jit(program).trace(*args).lower()
    return LoweredProgram(lowered, tuple(messages))


def call_kept(fn, args: tuple):
    """``fn(*args)`` as ``eqx.filter_jit`` runs it (the arrays in ``args`` traced, everything else
    static), through a program kept on disk beside the compile cache (:func:`lower_program`'s
    store, keyed by :func:`program_key` of ``fn``, the static part and the arrays' shapes): a later
    process loads it instead of tracing. The program's checks are values, raised after it ran
    (``eqx.EquinoxRuntimeError`` with the check's message). Returns None, having run nothing, when
    the program cannot be kept (a static part that cannot be identified, a program ``jax.export``
    cannot serialize, an output that is not arrays): the caller then runs ``fn`` itself."""
    import equinox as eqx
    import jax

    from .._checks import raise_failed_check

    directory = program_dir()
    if directory is None:
        return None
    dynamic, static = eqx.partition(args, eqx.is_array)
    leaves, in_tree = jax.tree.flatten(dynamic)
    try:
        key = program_key(fn, (static,), tuple(leaves))
    except ValueError:
        return None
    if key not in _CALLED:
        _CALLED[key] = _compile_call(fn, static, in_tree, leaves, directory / f"{fn.__name__}-{key}.jaxcall", key)
        while len(_CALLED) > _KEEP_LOWERED:
            del _CALLED[next(iter(_CALLED))]
    entry = _CALLED[key]
    if entry is None:
        return None
    compiled, messages, out_tree = entry
    code, out = compiled(*leaves)
    return jax.tree.unflatten(out_tree, raise_failed_check(code, messages, out))


@contextlib.contextmanager
def kept_programs():
    """While in this block, every concrete ``tp.solve`` (not under a ``jit``/``vmap`` of the
    caller's) runs its program through :func:`call_kept`: traced once, kept beside JAX's
    compilation cache (when it is on, :func:`program_dir`), loaded by a later process instead of
    traced. :func:`~transformer_pde.runs.run_experiment` runs every experiment's ``compute`` so."""
    from .._checks import SOLVE_PROGRAMS

    token = SOLVE_PROGRAMS.set(call_kept if program_dir() is not None else None)
    try:
        yield
    finally:
        SOLVE_PROGRAMS.reset(token)


_CALLED: dict = {}
"""The programs :func:`call_kept` compiled in this process, by key (None: cannot be kept)."""


def _compile_call(fn, static, in_tree, leaves, path: Path, key: str):
    """(compiled program, checks' messages, output tree) of ``fn`` on ``leaves``, loaded from
    ``path`` or traced, exported and kept there; None when it cannot be kept."""
    import equinox as eqx
    import jax

    from .._checks import checks_as_values

    kept = _load(path, key)
    if kept is not None:
        exported, header = kept
        messages = _messages(header)
        try:
            out_tree = _load_tree(header["tree"])
        except Exception:  # noqa: BLE001 - a header this version cannot read: traced again
            kept = None
        if messages is None:
            kept = None
    if kept is None:
        trees: list = []

        def flat(*arrays):
            out = fn(*eqx.combine(jax.tree.unflatten(in_tree, arrays), static))
            out_leaves, out_tree = jax.tree.flatten(out)
            trees[:] = [out_tree]
            return out_leaves

        messages_list: list = []
        try:
            exported = jax.export.export(jax.jit(checks_as_values(flat, messages_list)))(*leaves)
            out_tree, messages = trees[0], tuple(messages_list)
            header = {"messages": list(messages), "tree": _dump_tree(out_tree)}
            if _load_tree(header["tree"]) != out_tree:  # a tree that does not read back as itself is not kept
                return None
        except Exception:  # noqa: BLE001 - a callback left, a custom call export refuses, a tree pickle cannot hold
            return None
        _save(path, key, json.dumps(header).encode() + b"\n" + exported.serialize())
    return jax.jit(exported.call).trace(*leaves).lower().compile(), messages, out_tree


def _dump_tree(tree) -> str:
    """A program's output tree (equinox Modules: a solution) as text: pickled, equinox's marker of a
    dynamic field kept as itself (it is compared by identity)."""
    from equinox._module._flatten import MISSING

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return "equinox-missing" if obj is MISSING else None

    buffer = io.BytesIO()
    Pickler(buffer).dump(tree)
    return base64.b64encode(buffer.getvalue()).decode()


def _load_tree(text: str):
    from equinox._module._flatten import MISSING

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            if pid != "equinox-missing":
                raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
            return MISSING

    return Unpickler(io.BytesIO(base64.b64decode(text))).load()


MAGIC = b"transformer-pde program 2\n"
"""The first line of a kept program; the key and the payload's SHA-256 follow, a line each; the
payload is the checks' messages (a JSON list, one line) and the serialized ``jax.export``."""


def _load(path: Path, key: str):
    """The program kept at ``path`` and its header (a JSON value: its checks' messages, ...), if it
    is a regular file written under ``key`` whose payload hashes as it says (else None: it is
    traced again and replaced)."""
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
    head, _, program = payload.partition(b"\n")
    try:
        return jax.export.deserialize(bytearray(program)), json.loads(head)
    except Exception:  # noqa: BLE001 - a payload this version cannot read is traced again
        return None


def _messages(header) -> tuple[str, ...] | None:
    """The checks' messages a kept program's header holds (None: not a list of strings)."""
    messages = header.get("messages") if isinstance(header, dict) else header
    if isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        return tuple(messages)
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
