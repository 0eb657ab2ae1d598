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
numbers are the same bits. Its compiled executable is kept too (``xla-<key>.jaxexe``, for a
program holding no custom call: :func:`_keep_executable`), keyed by the lowered module, the
compiler options, the JAX version and the host (backend, devices, the processor's model and
flags), and a link to it under the program's key (``<name>-<key>.jaxlink``): a later process on
the same host loads it (``jax.experimental.serialize_executable``) instead of lowering the program
and asking JAX's compilation cache, and runs the very executable the first ran; after an edit of
the package (every program's key changes) a program whose module did not change is linked to the
executable it had. Not seen: a dependency edited in place without a new version (remove
``<cache>/programs``, or run with ``--compile-cache off``). Programs are kept when JAX's
compilation cache is on (the CLI turns it on; ``--compile-cache off`` turns both off), in
``<cache>/programs``, written atomically.
Each file carries its key and the SHA-256 of its payload, both checked when it is loaded: a
file copied over another key's, edited, truncated or not a regular file is never run; it is
traced again and replaced. A program holding a host callback (a runtime
check, ``eqx.error_if``) cannot be serialized: :func:`lower_program` lowers it as before and does
not keep it, as JAX's compilation cache does not keep its executable; :func:`call_kept` reports
this library's checks as values instead (:mod:`.reported_checks`) and keeps it (a program holding
another library's check stays unkept). A program may hold jax-finufft's NUFFT calls (the fast
kernel's), which ``jax.export`` does not list as stable: :func:`_export` allows them by name
(:data:`~transformer_pde.kernels.platforms.FINUFFT_CUSTOM_CALLS`, and no other), the file
records the ones the program holds, and loading it imports jax-finufft (which registers them)
before the program is compiled; a file allowing any other call is not run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import pickle
import re
import stat
import sys
import tempfile
import types
from pathlib import Path

__all__ = ["call_kept", "carry_checks", "compile_program", "finite_by_construction", "kept_programs",
           "lower_program", "program_dir", "program_key", "unit_row_tolerance", "unit_rows_by_construction"]

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
    return _program_key(fn, static, args, "lower_program")


def _program_key(fn, static: tuple, args: tuple, caller: str) -> str:
    import jax
    import numpy as np

    from .fingerprint import run_fingerprint

    if not isinstance(fn, types.FunctionType):
        raise ValueError(f"{caller}: fn must be a Python function, got {type(fn).__name__} "
                         f"{fn!r}"[:300])
    if not isinstance(static, tuple):
        raise ValueError(f"{caller}: static must be a tuple (the arguments not traced), got "
                         f"{type(static).__name__} {static!r}"[:300])
    if not isinstance(args, tuple) or not all(
            isinstance(a, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) for a in args):
        raise ValueError(f"{caller}: args must be a tuple of arrays or jax.ShapeDtypeStruct, got "
                         f"{args!r}"[:300])
    name = f"{fn.__module__}.{fn.__qualname__}"
    try:
        identity = run_fingerprint(fn=fn, static=static)
    except ValueError as e:
        raise ValueError(f"{caller} cannot key the program {name}: {e}") from None
    return _key(name, identity, args)


def _key(name: str, identity: str, args) -> str:
    """SHA-256 of a program's name and identity, its arguments' shapes and dtypes, and what
    tracing reads besides (the package source, library versions, JAX's configuration, platform)."""
    import jax

    parts = [
        name, identity,
        repr([_Aval.of(a) for a in args]),
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


def carry_checks(transform, fn):
    """``transform(fn)`` for a transform that returns its function's outputs (``jax.vmap``,
    ``jax.jit``, ``eqx.filter_jit``), whose body can hold the library's runtime checks in a program
    the runs layer keeps: an experiment's own ``vmap`` of ``tp.solve`` wrapped so is kept where
    ``checkify`` cannot carry its checks (a while loop under the vmap: a cluster count, a Sinkhorn
    divergence), each failed check raised after the program with its message
    (:mod:`.reported_checks`). Outside such a program,
    exactly ``transform(fn)``: ``carry_checks(jax.vmap, f)(xs)`` is ``jax.vmap(f)(xs)``."""
    from .._checks import carry_checks as carry

    return carry(transform, fn)


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
    return _memoized(_LOWERED, fn, static, args, compiler_options, "lower_program",
                     lambda key: _lower(fn, static, args, key, compiler_options)[0])


def _memoized(memo: dict, fn, static, args, compiler_options, caller: str, make):
    """``make(key)`` once per program key and compiler options in this process (``memo`` keeps the
    newest :data:`_KEEP_LOWERED`); a bad ``fn``, ``static``, ``args`` or ``compiler_options`` is a
    ValueError naming ``caller``."""
    if compiler_options is not None and not isinstance(compiler_options, dict):
        raise ValueError(f"{caller}: compiler_options must be a dict of XLA options or None, got "
                         f"{compiler_options!r}"[:300])
    key = _program_key(fn, static, args, caller)
    entry = (key, _options_key(compiler_options))
    if entry not in memo:
        memo[entry] = make(key)
        while len(memo) > _KEEP_LOWERED:
            del memo[next(iter(memo))]
    return memo[entry]


_LOWERED: dict = {}
"""The programs this process lowered, by key and compiler options (oldest first)."""
_KEEP_LOWERED = 32


def compile_program(fn, static: tuple = (), args: tuple = (), *, compiler_options=None):
    """``lower_program(fn, static, args, compiler_options=...).compile()``, a ``jax.stages.Compiled``,
    with its executable kept beside the program (:func:`_keep_executable`): a later process on this
    host loads it, neither lowering the program nor asking JAX's compilation cache, and runs the
    same bits. A later call in the same process returns the same object."""
    return _memoized(_COMPILED, fn, static, args, compiler_options, "compile_program",
                     lambda key: _compile(fn, static, args, key, compiler_options))


def _compile(fn, static, args, key, compiler_options):
    directory = program_dir()
    path = None if directory is None else directory / f"{fn.__name__}-{key}{EXPORTED}"
    compiled = None if path is None else _load_executable(path, key, compiler_options)
    if compiled is None:
        # lowered afresh (not lower_program's Lowered, which may have compiled before: see _keep_executable)
        lowered, kept = _lower(fn, static, args, key, compiler_options)
        compiled = _compile_and_keep(lowered, path, key, compiler_options) if kept else lowered.compile()
    return compiled


_COMPILED: dict = {}
"""The programs this process compiled through :func:`compile_program`, as :data:`_LOWERED`."""


def _lower(fn, static, args, key, compiler_options):
    """``(Lowered, kept)``: lowered from the program kept under ``key`` (``kept`` True), traced and
    kept first where none is; else (the store off, a host callback) traced as it is."""
    import jax

    jit = functools.partial(jax.jit, compiler_options=compiler_options)
    directory = program_dir()
    if directory is not None:
        path = directory / f"{fn.__name__}-{key}{EXPORTED}"
        exported = _load(path, key)
        if exported is None:
            try:
                exported = _export(jax.jit(functools.partial(fn, *static)), args)
            except NotImplementedError as e:  # a host callback (a runtime check) cannot be serialized
                if "host_callbacks" not in str(e):
                    raise
            else:
                _save(path, key, exported.serialize())
        if exported is not None:
            return jit(exported.call).trace(*args).lower(), True
    return jit(fn, static_argnums=tuple(range(len(static)))).trace(*static, *args).lower(), False


@contextlib.contextmanager
def kept_programs():
    """While in this block, with JAX's compilation cache on (:func:`program_dir`), every concrete
    ``tp.solve`` (not under a ``jit``/``vmap`` of the caller's) runs its program through
    :func:`call_kept`: traced once, kept beside the cache, loaded by a later process instead of
    traced. :func:`~transformer_pde.runs.run_experiment` computes every experiment in it."""
    from .._programs import SOLVE_RUNNER

    if program_dir() is not None:
        from .reported_checks import prepare_reporting

        prepare_reporting()
    token = SOLVE_RUNNER.set(call_kept if program_dir() is not None else None)
    try:
        yield
    finally:
        SOLVE_RUNNER.reset(token)


def call_kept(fn, args: tuple):
    """``fn(*args)`` as ``eqx.filter_jit(fn)`` runs it (the arrays in ``args`` traced, the rest
    static), through a program kept in :func:`program_dir` (``<key>.jaxcall``: the ``jax.export``
    of ``fn`` on the arrays, and the pickled shape of its output), keyed as :func:`lower_program`
    keys its programs, the static part fingerprinted with the closures and defaults of library
    functions too (an experiment's statistic capturing a sample is another program). A later
    process loads it instead of tracing; a later call in this process with the same static part
    and shapes (or another static part with the same key) runs the same compiled program. Both
    the first run and later ones run the exported program, so their numbers are the same bits.

    The program's runtime checks of this library (``_checks.runtime_check``, elsewhere an
    ``eqx.error_if``: a host callback, which ``jax.export`` cannot serialize) are reported as
    values (:mod:`.reported_checks`): a failed one raises ``eqx.EquinoxRuntimeError`` with its
    message after the program ran.

    Returns None, having run nothing, when the program cannot be kept (the compilation cache off,
    traced or multi-device arrays, a static part that cannot be identified or hashed, a program
    holding a host callback that is no check of this library (another library's ``eqx.error_if``,
    diffrax's with ``throw=True``), a check neither ``checkify`` nor collecting can carry (one in a
    program holding a vmapped while loop, traced in a body no ``carry_checks`` hands out), an
    output that cannot be pickled): the caller then runs ``fn``
    itself. A program export refused leaves a ``<key>.refused`` mark, so a later process does not
    trace it twice."""
    import jax

    from .reported_checks import raise_reported

    if not callable(fn):
        raise ValueError(f"call_kept: fn must be a function, got {type(fn).__name__} {fn!r}"[:300])
    if not isinstance(args, tuple):
        raise ValueError(f"call_kept: args must be a tuple (fn's arguments), got {type(args).__name__} "
                         f"{args!r}"[:300])
    directory = program_dir()
    if directory is None:
        return None
    leaves, treedef = jax.tree.flatten(args)
    arrays = [v for v in leaves if _is_array(v)]
    if any(isinstance(a, jax.core.Tracer) or (isinstance(a, jax.Array) and len(a.sharding.device_set) > 1)
           for a in arrays):
        return None
    spec = tuple(_Aval.of(v) if _is_array(v) else v for v in leaves)
    memo = (fn, treedef, spec)
    try:
        entry = _CALLS.get(memo, _MISSING)
    except TypeError:  # an unhashable static part: eqx.filter_jit refuses it too
        return None
    if entry is _MISSING:
        entry = _CALLS[memo] = _kept_call(fn, treedef, spec, arrays, directory)
        while len(_CALLS) > _KEEP_CALLS:
            del _CALLS[next(iter(_CALLS))]
    if entry is None:
        return None
    call, skeleton = entry
    outputs = call(*arrays)
    if isinstance(skeleton, _Reported):  # its checks reported as values: raised now, as they would have
        raise_reported(outputs[-2], outputs[-1], skeleton.messages)
        outputs, skeleton = outputs[:-2], skeleton.skeleton
    return jax.tree.map(lambda v: outputs[v.index] if isinstance(v, _Slot) else v, skeleton,
                        is_leaf=lambda v: isinstance(v, _Slot))


_MISSING = object()
_CALLS: dict = {}
""":func:`call_kept`'s programs in this process, by function, tree and static leaves and shapes
(as ``eqx.filter_jit`` caches them; None: not kept), oldest first."""
_BY_KEY: dict = {}
"""The same programs by their key (a static part equal by fingerprint, not by ``==``)."""
_KEEP_CALLS = 64


def _is_array(value) -> bool:
    """``eqx.is_array``: what ``eqx.filter_jit`` traces (a JAX or NumPy array or NumPy scalar),
    without importing Equinox, which a run loading its kept programs need not (about 0.2 s)."""
    import jax
    import numpy as np

    return isinstance(value, (jax.Array, np.ndarray, np.generic))


class _Aval(tuple):
    """An array argument as the program sees it: shape, dtype, weak type (an array, a NumPy array
    or a ``jax.ShapeDtypeStruct``; NumPy's have no weak type). Also what a program's key holds."""

    @classmethod
    def of(cls, a):
        import jax

        # a JAX array (a tracer too) carries a weak type in its abstract value (a typed PRNG key array
        # has no weak_type attribute of its own), a ShapeDtypeStruct in a field; NumPy's none
        if isinstance(a, jax.ShapeDtypeStruct):
            weak = a.weak_type
        elif isinstance(a, jax.Array):
            weak = jax.typeof(a).weak_type
        else:
            weak = False
        return cls((tuple(a.shape), str(a.dtype), bool(weak)))


class _Slot:
    """Where an output array goes in the output's tree (picklable, unlike a tree definition)."""

    def __init__(self, index: int):
        self.index = index

    def __eq__(self, other):
        return isinstance(other, _Slot) and other.index == self.index

    def __hash__(self):
        return hash(("slot", self.index))


class _Reported:
    """A kept program's output skeleton when the program reports its runtime checks as values
    (:mod:`.reported_checks`): its last two outputs say whether one failed and which of
    ``messages``."""

    def __init__(self, skeleton, messages: tuple):
        self.skeleton, self.messages = skeleton, messages


def _outputs_of(kept):
    """The output skeleton of a kept program's pickled part."""
    return kept.skeleton if isinstance(kept, _Reported) else kept


def _kept_call(fn, treedef, spec, arrays, directory: Path):
    """(jitted program, output skeleton) of ``fn`` on ``arrays``: loaded from ``directory``, or
    traced, exported and kept there; None when it cannot be kept."""
    import jax

    from .fingerprint import _Fingerprint

    name = f"{fn.__module__}.{fn.__qualname__}"
    fingerprint = _Fingerprint(closures=True)
    try:
        fingerprint.add(fn, "fn")
        # the arguments with each array replaced by its place: the arrays' shapes go in the key
        fingerprint.add(jax.tree.unflatten(treedef, [("array",) if isinstance(v, _Aval) else v for v in spec]),
                        "static arguments")
    except ValueError:  # an object known only by its address: cannot be told from another
        return None
    key = _key(name, fingerprint.h.hexdigest(), arrays)
    if key in _BY_KEY:
        return _BY_KEY[key]
    path = directory / f"{fn.__name__}-{key}"
    if _read(path.with_suffix(REFUSED), key) is not None:
        return None
    entry = _load_call(path.with_suffix(CALL), key, arrays)
    if entry is None:
        entry = _export_call(fn, treedef, spec, arrays, path, key)
    _BY_KEY[key] = entry
    while len(_BY_KEY) > _KEEP_CALLS:
        del _BY_KEY[next(iter(_BY_KEY))]
    return entry


def _export_call(fn, treedef, spec, arrays, path: Path, key: str):
    import jax

    from .reported_checks import collecting, reporting

    skeleton = []

    def flat(*traced):
        given = iter(traced)
        out = fn(*jax.tree.unflatten(treedef, [next(given) if isinstance(v, _Aval) else v for v in spec]))
        leaves, out_tree = jax.tree.flatten(out)
        index = iter(range(len(leaves)))
        skeleton[:] = [jax.tree.unflatten(out_tree, [_Slot(next(index)) if _is_array(v) else v
                                                      for v in leaves])]
        return [v for v in leaves if _is_array(v)]

    # traced once, this library's checks reported as values (raised after it runs): a program
    # holding them is kept too; a program with no check reports none. checkify carries a check from
    # anywhere, but not past a while loop under a vmap (a vmapped cluster count or Sinkhorn); collecting
    # passes those, carrying checks from the top and the library's transforms only: tried second
    reasons, exported = [], None
    for build in (reporting, collecting):
        program, messages = build(flat)
        try:
            exported = _export(jax.jit(program), arrays)
            break
        except Exception as e:  # noqa: BLE001 - a host callback (another library's check, which cannot
            # be serialized: in either way), a check neither can carry, anything else export refuses
            reasons.append(f"{build.__name__}: {type(e).__name__}: {e}"[:2000])
            if isinstance(e, NotImplementedError) and "host_callbacks" in str(e):
                break
    if exported is None:  # the caller traces as before; a later process does not try again (the key
        # fixes the outcome); the mark says why
        _save(path.with_suffix(REFUSED), key, "\n".join(reasons).encode())
        return None
    kept = _Reported(skeleton[0], tuple(messages))
    try:
        tree = pickle.dumps(kept)
        loaded = pickle.loads(tree)
        if (jax.tree.structure(_outputs_of(loaded)) != jax.tree.structure(_outputs_of(kept))
                or isinstance(loaded, _Reported) and loaded.messages != kept.messages):
            return None
    except Exception:  # noqa: BLE001 - an output pickle cannot hold as itself is not kept
        return None
    _save(path.with_suffix(CALL), key, f"{len(tree)}\n".encode() + tree + exported.serialize())
    return _compile_kept(exported, arrays, path, key), kept


def _load_call(path: Path, key: str, arrays):
    """(compiled program, output skeleton) kept at ``path`` under ``key``, else None."""
    payload = _read(path, key)
    if payload is None:
        return None
    try:
        size, _, rest = payload.partition(b"\n")
        skeleton = pickle.loads(rest[:int(size)])
        compiled = _load_executable(path, key)
        if compiled is not None:
            return compiled, skeleton
        exported = _deserialize(rest[int(size):])
    except Exception:  # noqa: BLE001 - a payload this version cannot read is traced again
        return None
    return None if exported is None else (_compile_kept(exported, arrays, path, key), skeleton)


EXPORTED = ".jaxexport"
"""The suffix of a whole program kept by :func:`lower_program` (``<fn>-<key>.jaxexport``)."""
CALL = ".jaxcall"
"""The suffix of a solve's program kept by :func:`call_kept` (``<fn>-<key>.jaxcall``)."""
REFUSED = ".refused"
"""The suffix of the reasons a program was not kept (``<fn>-<key>.refused``: :func:`call_kept`)."""
EXECUTABLE = ".jaxexe"
"""The suffix of a compiled executable (``xla-<its XLA key>.jaxexe``: :func:`_keep_executable`)."""
LINK = ".jaxlink"
"""The suffix of a kept program's link to its executable (``<name>-<key>.jaxlink``, holding the
executable's XLA key)."""


@functools.cache
def _host() -> str:
    """What a compiled executable depends on besides its program: the backend, its version and
    devices, and on a CPU the processor (its model and instruction-set flags: XLA compiles for the
    host it runs on, so a cache directory copied to another machine is not loaded there)."""
    import platform

    import jax

    client = jax.devices()[0].client
    parts = [client.platform, client.platform_version, platform.machine(), platform.processor(),
             repr([d.device_kind for d in jax.devices()])]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            parts += sorted({line.strip() for line in f
                             if line.startswith(("model name", "flags", "Features", "CPU implementer", "CPU part"))})
    except OSError:  # no /proc (macOS, Windows): the machine and processor names above
        pass
    return "\n".join(parts)


def _options_key(compiler_options) -> str:
    """XLA compiler options (a dict or None) as they enter a key, whatever their order."""
    return repr(sorted((compiler_options or {}).items()))


def _link_place(path: Path, key: str, compiler_options) -> tuple[Path, str] | None:
    """``(file, key)`` of the link from the program kept at ``path`` under ``key``, compiled with
    ``compiler_options`` on this host, to its executable; None on a host with several devices (an
    executable is compiled for one device, a jitted call follows its arguments')."""
    import jax

    if len(jax.devices()) != 1:
        return None
    link_key = hashlib.sha256(f"{key}\n{_options_key(compiler_options)}\n{_host()}".encode()).hexdigest()
    return path.with_name(f"{path.stem.rpartition('-')[0]}-{link_key}{LINK}"), link_key


def _xla_key(text: str, compiler_options) -> str:
    """What XLA compiles from: the lowered module's text (``Lowered.as_text()``, without debug
    locations, as JAX's own cache key strips them), the compiler options and ``XLA_FLAGS``, JAX's
    and jaxlib's versions and the host. Programs kept under different keys (the same solve after an
    edit elsewhere in the package, which changes every program key) share one executable."""
    parts = [hashlib.sha256(text.encode()).hexdigest(), _options_key(compiler_options),
             os.environ.get("XLA_FLAGS", ""), _version("jax"), _version("jaxlib"), _host()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _executable_file(directory: Path, xla_key: str) -> Path:
    return directory / f"xla-{xla_key}{EXECUTABLE}"


def _compile_kept(exported, args, path: Path, key: str):
    """``jax.jit(exported.call)`` compiled for ``args``, its executable kept (:func:`_keep_executable`)."""
    import jax

    return _compile_and_keep(jax.jit(exported.call).trace(*args).lower(), path, key, None)


def _compile_and_keep(lowered, path: Path, key: str, compiler_options):
    """``lowered.compile()`` (lowered from the program kept at ``path``), its executable kept."""
    with _compilations() as seen:
        compiled = lowered.compile()
    _keep_executable(lowered, compiled, seen, path, key, compiler_options)
    return compiled


@contextlib.contextmanager
def _compilations():
    """A set filled while in this block, from any thread: ``"compiled"`` once XLA compiled a
    program, ``"cache"`` once JAX's persistent cache served one (``jax.monitoring``'s events)."""
    import jax

    seen = set()

    def compiled(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.add("compiled")

    def served(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            seen.add("cache")

    jax.monitoring.register_event_duration_secs_listener(compiled)
    jax.monitoring.register_event_listener(served)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(compiled)
        jax.monitoring.unregister_event_listener(served)


def _keep_executable(lowered, compiled, seen: set, path: Path, key: str, compiler_options) -> None:
    """Keep ``compiled`` (the program kept at ``path`` under ``key``, ``lowered`` from its export)
    and a link to it from the program (:func:`_link_place`), so that a later process on this host
    loads it (:func:`_load_executable`) instead of lowering the program and asking JAX's compilation
    cache: that lowering (with JAX's import of SciPy's LAPACK, which lowering any exported program on
    a CPU does) was about a third of a second of every second tiny run.

    An executable is written only where XLA has just compiled it (``seen``: :func:`_compilations`,
    with no executable served by JAX's cache meanwhile, in any thread): one that JAX's persistent
    cache loaded serializes without its kernels on a CPU (jaxlib 0.10: the loaded copy then fails
    with "NOT_FOUND: Function ... not found"). Where JAX's cache served it, the program is linked
    to the executable an earlier compile of the same module kept (:func:`_xla_key`), if there is
    one. Only a program holding no custom call: its executable needs nothing registered."""
    link = _link_place(path, key, compiler_options)
    text = None if link is None else lowered.as_text()
    if text is None or _CUSTOM_CALL.search(text) is not None:
        return
    xla_key = _xla_key(text, compiler_options)
    exe = _executable_file(path.parent, xla_key)
    if seen == {"compiled"}:
        try:
            from jax.experimental import serialize_executable

            payload = pickle.dumps(serialize_executable.serialize(compiled))
        except Exception:  # noqa: BLE001 - an executable this backend cannot serialize is compiled again
            return
        _save(exe, xla_key, payload)
    elif not exe.is_file():
        return
    _save(link[0], link[1], xla_key.encode())


def _load_executable(path: Path, key: str, compiler_options=None):
    """The executable linked from the program kept at ``path`` under ``key``
    (:func:`_keep_executable`), loaded (a ``jax.stages.Compiled``, the same bits the process that
    compiled it ran), else None: no link, not this host's, or a file that does not verify
    (:func:`_read`) or does not load."""
    link = _link_place(path, key, compiler_options)
    xla_key = None if link is None else _read(*link)
    if xla_key is None or not re.fullmatch(rb"[0-9a-f]{64}", xla_key):
        return None
    payload = _read(_executable_file(path.parent, xla_key.decode()), xla_key.decode())
    if payload is None:
        return None
    try:
        from jax.experimental import serialize_executable

        return serialize_executable.deserialize_and_load(*pickle.loads(payload))
    except Exception:  # noqa: BLE001 - compiled again and replaced
        return None


MAGIC = b"transformer-pde program 1\n"
"""The first line of a kept program; the key and the payload's SHA-256 follow, a line each."""


def _load(path: Path, key: str):
    """The program kept at ``path`` if it is a regular file written under ``key`` whose payload
    hashes as it says (else None: it is traced again and replaced)."""
    payload = _read(path, key)
    if payload is None:
        return None
    try:
        return _deserialize(payload)
    except Exception:  # noqa: BLE001 - a payload this version cannot read is traced again
        return None


def _export(jitted, args):
    """``jax.export.export(jitted)(*args)``, where the program may also hold jax-finufft's custom
    calls (the fast kernel's NUFFT: :data:`~transformer_pde.kernels.platforms.FINUFFT_CUSTOM_CALLS`,
    allowed here and nowhere else), which ``jax.export`` refuses by default (they are not on its
    list of calls stable across versions; a kept program's key names jax-finufft's version). The
    export lists the ones the program holds among its disabled checks, and only those:
    :func:`_deserialize` registers them before such a program is run."""
    import jax

    from ..kernels.platforms import FINUFFT_CUSTOM_CALLS

    allowed = [jax.export.DisabledSafetyCheck.custom_call(t) for t in FINUFFT_CUSTOM_CALLS]
    exported = jax.export.export(jitted, disabled_checks=allowed)(*args)
    # jax-finufft's rules, registered when it is imported (while tracing), lower to its calls: a
    # program traced in a process without it holds none (no need to read the module's text)
    held = set()
    if "jax_finufft" in sys.modules:
        held = {a or b for a, b in _CUSTOM_CALL.findall(exported.mlir_module())}
    return dataclasses.replace(exported, disabled_safety_checks=tuple(
        check for check in allowed if check.is_custom_call() in held))


_CUSTOM_CALL = re.compile(r'custom_call @([\w.$-]+)|call_target_name = "([^"]+)"')
"""A custom call in a module's text (the pretty form, or the generic one): its target's name."""


def _deserialize(payload: bytes | bytearray):
    """The ``jax.export.Exported`` serialized in ``payload`` (a verified kept file's), with the
    custom calls it holds registered; None when it allows a check other than jax-finufft's calls
    (a file not written by :func:`_export`) or jax-finufft, which it calls, is not installed."""
    import jax

    exported = jax.export.deserialize(bytearray(payload))
    calls = [check.is_custom_call() for check in exported.disabled_safety_checks]
    if not calls:
        return exported
    # only now: importing the kernels package imports its backends (equinox), which a second run
    # whose programs are all loaded never needs
    from ..kernels.platforms import FINUFFT_CUSTOM_CALLS, register_finufft_calls

    if not all(c in FINUFFT_CUSTOM_CALLS for c in calls) or not register_finufft_calls():
        return None
    return exported


def _read(path: Path, key: str) -> bytes | None:
    """The payload of the file at ``path`` if it is a regular file written under ``key`` whose
    payload hashes as it says, else None."""
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
    return payload


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
