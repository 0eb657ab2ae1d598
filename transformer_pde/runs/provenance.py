"""Where a run came from: package versions, the JAX backend and devices, the git commit of the
checkout, the platform and the command (recorded in ``metadata.json``)."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path

PACKAGES = ("transformer_pde", "jax", "jaxlib", "equinox", "diffrax", "ott-jax", "optax",
            "numpy", "matplotlib", "xarray", "h5netcdf")
"""The packages whose versions a run records."""


def versions() -> dict:
    """Python's version and those of :data:`PACKAGES` (None where not installed)."""
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    """The commit of the checkout that holds this package, ``-dirty`` when tracked files were
    changed (None outside a git checkout)."""
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        if res.returncode != 0 or not res.stdout.strip():
            return None
        commit = res.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    """Everything above, as the ``metadata.json`` keys of a run (imports JAX)."""
    import jax

    return {
        "versions": versions(),
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kinds": sorted({d.device_kind for d in jax.devices()}),
        "x64": bool(jax.config.jax_enable_x64),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "command": sys.argv,
    }


__all__ = ["PACKAGES", "environment", "git_commit", "versions"]
