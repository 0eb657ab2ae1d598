"""JAX's persistent compilation cache for command-line runs: compile once, per user.

A CLI run compiles every program from nothing; JAX can keep the compiled executables on disk
and load them in the next process. :func:`resolve_compile_cache` picks the directory:
``--compile-cache DIR|off``, else the environment variable ``TRANSFORMER_PDE_COMPILE_CACHE``
(a directory, or ``off``), else ``$XDG_CACHE_HOME/transformer_pde/jax`` (``~/.cache/...`` when
unset). :func:`enable_compile_cache` turns it on with no minimum compile time, so the many small
programs of a short run are cached too (JAX's default caches only programs that took >= 1 s);
given None (``off``) it turns JAX's cache off, whatever ``JAX_COMPILATION_CACHE_DIR`` says.
Nothing here imports JAX at module level (``transformer-pde list`` and ``--help`` stay instant).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["COMPILE_CACHE_ENV", "default_compile_cache", "enable_compile_cache",
           "resolve_compile_cache"]

COMPILE_CACHE_ENV = "TRANSFORMER_PDE_COMPILE_CACHE"
_OFF = {"off", "none", "no", "0", "false"}


def default_compile_cache() -> Path:
    """``$XDG_CACHE_HOME/transformer_pde/jax``, or ``~/.cache/transformer_pde/jax``."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "transformer_pde" / "jax"


def resolve_compile_cache(option: str | None = None) -> Path | None:
    """The cache directory: ``option`` (``--compile-cache``), else ``$TRANSFORMER_PDE_COMPILE_CACHE``,
    else :func:`default_compile_cache`; None when the one that decides says ``off``."""
    for value in (option, os.environ.get(COMPILE_CACHE_ENV)):
        if value is None or not str(value).strip():
            continue
        value = str(value).strip()
        return None if value.lower() in _OFF else Path(value).expanduser()
    return default_compile_cache()


def enable_compile_cache(path: Path | None) -> Path | None:
    """Turn JAX's persistent compilation cache on at ``path``, or off for None and for a directory
    that cannot be created (a run never fails for its cache). Off means off: also when the
    environment (``JAX_COMPILATION_CACHE_DIR``) or an earlier run in this process turned JAX's cache
    on, and with it the kept programs (:func:`.programs.program_dir` lives beside it)."""
    if path is not None:
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError:
            path = None
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    # JAX opens its cache at the first compile of a process and keeps it: forget it, so the
    # directory set here is the one the next compile uses (a no-op before any compile)
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", None if path is None else str(path))
    if path is None:
        return None
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return Path(path)
