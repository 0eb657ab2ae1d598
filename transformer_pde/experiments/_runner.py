"""Run an experiment into a directory: data, metadata and figures, written atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np

from ._base import Experiment

_PACKAGES = ("transformer_pde", "jax", "jaxlib", "equinox", "diffrax", "ott-jax", "optax",
             "numpy", "matplotlib")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename: never half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_npz(path: Path, arrays: dict) -> None:
    import io

    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    atomic_write_bytes(path, buf.getvalue())


def save_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def _versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5)
        return res.stdout.strip() or None if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    import jax

    return {
        "versions": _versions(),
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "x64": bool(jax.config.jax_enable_x64),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
    }


def run_experiment(exp: Experiment, config, out_dir: Path, *, progress: bool = True) -> dict:
    """Compute, save ``data.npz``, ``config.json``, ``metadata.json`` and the figures.

    Returns ``{"data": path, "metadata": path, "figures": [paths], "results": dict}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.asdict(config)
    save_json(out_dir / "config.json", cfg)
    start = time.perf_counter()
    results = exp.compute(config, progress)
    wall = time.perf_counter() - start
    data_path = out_dir / "data.npz"
    save_npz(data_path, results)
    figures = [str(p) for p in exp.figures(results, config, out_dir)]
    meta = {
        "experiment": exp.name,
        "summary": exp.summary,
        "config": cfg,
        "wall_time_s": wall,
        "figures": figures,
        "data": str(data_path),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **environment(),
    }
    meta_path = out_dir / "metadata.json"
    save_json(meta_path, meta)
    return {"data": data_path, "metadata": meta_path, "figures": figures, "results": results}
