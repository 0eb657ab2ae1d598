"""``transformer-pde info RUN_DIR``: what a run directory holds, as text, read from its files
without importing JAX (the metadata, and the array headers of ``data.npz``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from .directory import CORRUPT_FILE_ERRORS, METADATA_FILE, STATUS_COMPLETE, error_text, require_run
from .result import DATA_FILE, GRIDS_FILE


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(_value(x) for x in v)
    return str(v)


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _arrays(path: Path) -> list[str]:
    """``name (shape) dtype`` of each member of an ``.npz``, from the headers (other versions of
    the format: the array itself)."""
    out = []
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            with z.open(member) as f:
                version = np.lib.format.read_magic(f)
                if version in _HEADER_READERS:
                    shape, _, dtype = _HEADER_READERS[version](f)
                else:
                    f.seek(0)
                    a = np.lib.format.read_array(f, allow_pickle=False)
                    shape, dtype = a.shape, a.dtype
            out.append(f"{member.removesuffix('.npy')} {tuple(shape)} {dtype}")
    return out


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The first bytes of a netCDF-4 (HDF5) file."""


def _grids_problem(nc: Path, listed: bool, complete: bool) -> str | None:
    """What is wrong with ``results.nc`` (read as far as its signature, without xarray), or None."""
    if not nc.exists() and not nc.is_symlink():
        return "missing, though the metadata lists grids: run it again" if listed and complete else None
    if not nc.is_file():
        return "unreadable (not a file)"
    try:
        with open(nc, "rb") as f:
            head = f.read(len(_HDF5_SIGNATURE))
    except OSError as e:
        return f"unreadable ({error_text(e)})"
    if head != _HDF5_SIGNATURE:
        return "unreadable (not a netCDF-4/HDF5 file)"
    if not listed:
        return "not listed in the metadata (not this run's result; tp.Result.load ignores it)"
    return None


def run_info(run_dir) -> str:
    """A run's experiment, status, options, provenance and outputs, as lines of text.
    ValueError when ``run_dir`` holds no run (or its metadata is damaged)."""
    run_dir = Path(run_dir)
    meta = require_run(run_dir)
    status = meta["status"]
    when = ", ".join(f"{k} {meta[k]}" for k in ("created", "finished") if meta.get(k))
    if isinstance(meta.get("wall_time_s"), (int, float)):
        when += f", {meta['wall_time_s']:.3g} s computing"
    if meta.get("resumed"):
        when += f", resumed {meta['resumed']} time(s)"
    lines = [f"run:         {run_dir}",
             f"experiment:  {meta['experiment']}" + (f" ({meta['summary']})" if meta.get("summary") else ""),
             f"status:      {status}" + (f" ({when.lstrip(', ')})" if when else "")]
    if meta.get("error"):  # (every value is text here: read_metadata bounds the nesting)
        lines.append(f"error:       {meta['error']}")
    if status != STATUS_COMPLETE:
        lines.append(f"             continue it with: transformer-pde run --resume {run_dir}")
    config = meta.get("config", {})
    lines.append("options:     " + " ".join(f"{k}={_value(v)}" for k, v in config.items()))
    if meta.get("checkpoint_every") is not None:
        lines.append(f"             checkpoint_every={meta['checkpoint_every']}")
    versions = meta.get("versions") or {}
    if isinstance(versions, dict) and versions:
        lines.append("provenance:  " + ", ".join(f"{k} {_value(v)}" for k, v in versions.items() if v))
    elif versions:
        lines.append(f"provenance:  versions unreadable (a {type(versions).__name__}, not a table)")
    backend = meta.get("jax_backend")
    if backend:
        devices = meta.get("devices") or []
        devices = ", ".join(map(_value, devices)) if isinstance(devices, list) else _value(devices)
        lines.append(f"             JAX backend {_value(backend)}, devices {devices}, "
                     f"x64 {_value(bool(meta.get('x64')))}")
    for key, label in (("git_commit", "git commit"), ("platform", "platform")):
        if meta.get(key):
            lines.append(f"             {label} {meta[key]}")
    if isinstance(meta.get("command"), list):
        lines.append(f"             command: {' '.join(map(str, meta['command']))}")

    lines.append("outputs:")
    data = run_dir / DATA_FILE
    if data.is_file():
        try:
            arrays = _arrays(data)
            lines.append(f"  {DATA_FILE}    {len(arrays)} arrays: " + "; ".join(arrays))
        except CORRUPT_FILE_ERRORS as e:
            lines.append(f"  {DATA_FILE}    unreadable ({error_text(e)})")
    elif data.exists() or data.is_symlink():
        lines.append(f"  {DATA_FILE}    unreadable (not a file)")
    elif status == STATUS_COMPLETE:
        lines.append(f"  {DATA_FILE}    missing, though the run is complete: run it again")
    grids = meta.get("grid_names")
    nc = run_dir / GRIDS_FILE
    problem = _grids_problem(nc, listed=bool(grids or meta.get("grids")), complete=status == STATUS_COMPLETE)
    if problem:
        lines.append(f"  {GRIDS_FILE}  {problem}")
    elif nc.is_file():
        if isinstance(grids, list) and len(grids) == 1:
            lines.append(f"  {GRIDS_FILE}  one grid, {grids[0]!r}, as the root dataset: "
                         f"xarray.open_dataset({str(run_dir / GRIDS_FILE)!r})")
        elif isinstance(grids, list):
            lines.append(f"  {GRIDS_FILE}  grids {', '.join(map(repr, grids))}, one netCDF group each: "
                         f"xarray.open_dataset({str(run_dir / GRIDS_FILE)!r}, group=NAME)")
        else:
            lines.append(f"  {GRIDS_FILE}  labelled grids (see tp.Result.load(run_dir).grids)")
    figures = meta.get("figures") or []
    if isinstance(figures, list) and figures:
        lines.append("  figures     " + ", ".join(Path(str(f)).name for f in figures))
    if status == STATUS_COMPLETE:
        lines.append(f"load it:     tp.Result.load({str(run_dir)!r}); redraw: transformer-pde plot {run_dir}")
    elif not data.is_file():
        lines.append(f"  (none yet: the run is {status}; {METADATA_FILE} says where it stands)")
    return "\n".join(lines)


__all__ = ["run_info"]
