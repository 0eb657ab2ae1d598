"""Test-wide settings: float64, strict rank promotion and runtime shape/dtype checks.

* Validate in float64 (STYLE.md): every test runs with x64 enabled; float32 behaviour is
  checked by passing float32 arrays explicitly.
* ``jax_numpy_rank_promotion="raise"``: an implicit broadcast of arrays of different rank
  (``(n,) + (1, 1)``) is an error, so a shape slip cannot pass as a silent broadcast. ott's
  Sinkhorn VJP and jax-finufft's JVP broadcast implicitly inside: gradients through them are
  taken under ``jax.numpy_rank_promotion("allow")`` (``tp.fit`` does so itself).
* jaxtyping's import hook checks every annotated function and module of the package at call
  time with beartype (``Float[Array, "n d"]`` shapes agree across arguments and the return;
  ``int`` is accepted where ``float`` is annotated, PEP 484's numeric tower). The hook must be
  installed before the package is first imported, hence here. A wrong *type* passed to a public
  entry point then fails in the checker (``jaxtyping.TypeCheckError``, naming the parameter and
  the value) before the entry point's own ValueError: tests of those errors are marked
  ``package_errors`` and run with the checker off (the fixture below).
"""

import gc
import os
import sys
import tempfile

import jax
import jaxtyping
import pytest
from jaxtyping import install_import_hook

# the shared helpers (reference.py, _runs.py, ...) import by name from every subfolder of tests/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# the tests' subprocesses (CLI runs, kill/resume, sharding workers) and the CLI runs made in this
# process share a persistent JAX compilation cache in the temporary directory (never the user's
# ~/.cache): a run resumed, repeated or redrawn loads what an earlier one compiled. Set in the
# environment after JAX is configured here, so this process's own compilations are not cached; the
# tests of the cache name their own directory.
_TEST_CACHE = os.path.join(tempfile.gettempdir(), f"transformer_pde-tests-jax-cache-{os.getuid()}")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _TEST_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("TRANSFORMER_PDE_COMPILE_CACHE", _TEST_CACHE)

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

with install_import_hook("transformer_pde",
                         "beartype.beartype(conf=beartype.BeartypeConf(is_pep484_tower=True))"):
    # everything imported here is checked: every module of the package (the package itself
    # imports its submodules lazily, on first use, which would be after this block), the
    # experiments (they register on import) and the CLI
    import importlib
    import pkgutil

    import transformer_pde

    for _module in pkgutil.walk_packages(transformer_pde.__path__, "transformer_pde."):
        importlib.import_module(_module.name)


@pytest.fixture(autouse=True)
def _package_errors(request):
    """Tests marked ``package_errors`` pass inputs of a wrong type on purpose to check the
    package's own ValueError (what a user gets, with no type checker installed); the runtime type
    checker would raise first, so it is off for them (and only them)."""
    if request.node.get_closest_marker("package_errors") is None:
        yield
        return
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", False)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Each test module's compiled programs are dropped when it ends. A compiled XLA:CPU program
    holds about six memory mappings until its jit cache lets go of it, and a pytest-xdist worker
    lives for the whole session: the slow set's worker reached 63 862 mappings here, next to
    Linux's default limit of 65 530 (``vm.max_map_count``), past which the next compilation's
    mmap fails and the worker dies (a crash CI saw in ``test_properties.py``)."""
    yield
    jax.clear_caches()
    gc.collect()
