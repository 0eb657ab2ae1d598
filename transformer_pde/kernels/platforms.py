"""Where the fast kernel runs: the platforms jax-finufft was built for, found without importing it.

The fast Gaussian sum (:mod:`.fast`) calls jax-finufft, whose PyPI wheels are CPU-only; its CUDA
build (conda-forge ``jax-finufft`` with CUDA, or a source build with ``JAX_FINUFFT_USE_CUDA=ON``)
adds a ``jax_finufft_gpu`` extension next to ``jax_finufft_cpu``. :func:`fast_platforms` looks
for those extension files in the installed package (no import: neither jax-finufft nor its
FINUFFT libraries are loaded), so the kernel choice can be made statically: ``tp.kernels.Auto``
takes the exact kernel on a platform the NUFFT does not run on, and ``tp.kernels.Fast`` refuses
there naming what to install (:func:`no_fast_path_message`).
"""

from __future__ import annotations

import functools
import importlib.util
import os

__all__ = ["FINUFFT_CUSTOM_CALLS", "INSTALL_HINT", "current_platform", "fast_platforms", "no_fast_path_message",
           "register_finufft_calls"]

INSTALL_HINT = {
    "cpu": "pip install jax-finufft (CPU wheels on PyPI)",
    "gpu": ("jax-finufft built with CUDA: conda install -c conda-forge jax-finufft (its CUDA "
            "build), or a source build, JAX_FINUFFT_USE_CUDA=ON pip install --no-binary "
            "jax-finufft jax-finufft (the PyPI wheels are CPU-only)"),
}
"""What to install for the fast kernel on each JAX platform (``jax.default_backend()`` names)."""

FINUFFT_CUSTOM_CALLS = tuple(f"nufft{dim}d{kind}{single}" for dim in (1, 2, 3) for kind in (1, 2, 3)
                             for single in ("", "f"))
"""The XLA custom calls jax-finufft registers (a transform in 1-3 dimensions, of type 1-3, in
float64 or float32 ``f``): the only calls outside JAX's stable list that a program kept by the runs
layer may hold (the fast kernel's, :mod:`transformer_pde.runs.programs`). The key of a kept program
names jax-finufft's version, so a program is never run by another build of these calls."""


def register_finufft_calls() -> bool:
    """Import jax-finufft, which registers :data:`FINUFFT_CUSTOM_CALLS` with XLA, so that a program
    holding them (a kept program read back) compiles and runs; False when it is not installed."""
    try:
        import jax_finufft  # noqa: F401 - the import registers its calls
    except ImportError:
        return False
    return True


# the extension module of each platform, and the JAX platform it serves ("gpu" is CUDA here)
_EXTENSIONS = {"jax_finufft_cpu": "cpu", "jax_finufft_gpu": "gpu"}


@functools.lru_cache(maxsize=1)
def fast_platforms() -> frozenset[str]:
    """The JAX platforms (``"cpu"``, ``"gpu"``) the installed jax-finufft has a kernel for;
    empty without jax-finufft. Reads the package directory only (cached)."""
    spec = importlib.util.find_spec("jax_finufft")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    found = set()
    for folder in spec.submodule_search_locations:
        for name in os.listdir(folder):
            stem = name.split(".", 1)[0]
            if stem in _EXTENSIONS:
                found.add(_EXTENSIONS[stem])
    return frozenset(found)


def current_platform() -> str:
    """The platform computations run on by default (``jax.default_backend()``: cpu, gpu, tpu)."""
    import jax

    return jax.default_backend()


def no_fast_path_message(platform: str) -> str:
    """Why the fast kernel cannot run on ``platform``, and what to install."""
    have = ", ".join(sorted(fast_platforms())) or "none (jax-finufft is not installed)"
    hint = INSTALL_HINT.get(platform, "no jax-finufft build exists for this platform")
    return (f"the fast kernel (jax-finufft NUFFT) does not run on platform {platform!r}: the "
            f"installed jax-finufft serves {have}. To use it, install {hint}; or use tp.kernels.Exact() "
            "(or Auto, which takes the exact kernel here)")
