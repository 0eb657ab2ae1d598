"""What an experiment's ``compute`` returns: :class:`Result`, named arrays plus labelled grids.

``Result.arrays`` are the numbers of the run, saved to ``data.npz`` under their names (one
``.npy`` member each, deterministic bytes). ``Result.grids`` are the same numbers where they
form grids (β × d × seed × t, ...), as :class:`xarray.Dataset` s whose dimensions are named
after the swept axes and whose coordinates are the swept values; they are saved beside the
data as ``results.nc`` (netCDF-4, one group per dataset), so a run opens with the tools people
already use::

    import xarray as xr
    xr.open_dataset("runs/sweep-phase/results.nc", group="sweep")

``Result.load(run_dir)`` reads both back; ``transformer-pde plot RUN_DIR`` redraws the figures
from it without recomputing.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._io import FILE_MODE, result_array, save_npz

if TYPE_CHECKING:  # xarray is imported when grids are built or read
    import xarray as xr

DATA_FILE = "data.npz"
GRIDS_FILE = "results.nc"
NETCDF_ENGINE = "h5netcdf"


@dataclasses.dataclass(frozen=True, eq=False)
class Result(Mapping):
    """Named arrays (``data.npz``) and labelled grids (``results.nc``) of one run.

    Reads like a read-only dict of the arrays (``result["ts"]``), so figures and tests index
    it by name; ``result.grids["sweep"]["t_one"].sel(d=3)`` is the labelled view.

    Attributes:
        arrays: name -> NumPy array (numeric, bool or str; never object), in saving order.
        grids: name -> :class:`xarray.Dataset` (empty when the run has no grids).
    """

    arrays: Mapping[str, np.ndarray]
    grids: Mapping[str, "xr.Dataset"] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "arrays", {k: result_array(k, v) for k, v in dict(self.arrays).items()})
        grids = dict(self.grids)
        for name, ds in grids.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"grid names must be identifiers (netCDF groups), got {name!r}")
            if type(ds).__name__ != "Dataset":
                raise ValueError(f"grid {name!r} must be an xarray.Dataset, got {type(ds).__name__}")
        object.__setattr__(self, "grids", grids)

    # --- Mapping over the arrays --------------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def __repr__(self) -> str:
        grids = f", grids={sorted(self.grids)}" if self.grids else ""
        return f"Result({len(self.arrays)} arrays{grids})"

    # --- files ---------------------------------------------------------------------------
    def save(self, run_dir) -> list[Path]:
        """Write ``data.npz`` (and ``results.nc`` when there are grids) atomically; returns the
        paths written. A ``results.nc`` left by an earlier run without grids is removed."""
        run_dir = Path(run_dir)
        save_npz(run_dir / DATA_FILE, self.arrays)
        written = [run_dir / DATA_FILE]
        nc = run_dir / GRIDS_FILE
        if self.grids:
            save_netcdf_groups(nc, self.grids)
            written.append(nc)
        elif nc.exists():
            nc.unlink()
        return written

    @classmethod
    def load(cls, run_dir) -> Result:
        """The result saved in ``run_dir`` (its ``data.npz``, and ``results.nc`` if present)."""
        run_dir = Path(run_dir)
        path = run_dir / DATA_FILE
        if not path.exists():
            raise ValueError(f"{str(run_dir)!r} holds no {DATA_FILE} (not a complete run)")
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        nc = run_dir / GRIDS_FILE
        return cls(arrays, load_netcdf_groups(nc) if nc.exists() else {})


def save_netcdf_groups(path: Path, datasets: Mapping[str, "xr.Dataset"]) -> None:
    """Datasets as the groups of one netCDF-4 file, written to a temporary file and renamed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        for k, (name, ds) in enumerate(datasets.items()):
            ds.to_netcdf(tmp, mode="w" if k == 0 else "a", group=name, engine=NETCDF_ENGINE)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_netcdf_groups(path: Path) -> dict[str, "xr.Dataset"]:
    """The groups of a netCDF file written by :func:`save_netcdf_groups`, loaded into memory."""
    import xarray as xr

    groups = xr.open_groups(path, engine=NETCDF_ENGINE)
    try:
        return {name.strip("/"): ds.load() for name, ds in groups.items() if name != "/"}
    finally:
        for ds in groups.values():
            ds.close()


def grid(coords: Mapping[str, np.ndarray], **variables) -> "xr.Dataset":
    """A Dataset from NumPy arrays: ``grid({"beta": b, "t": ts}, fraction=(("beta", "t"), f))``.

    ``coords`` names the dimensions and gives their values; each variable is ``(dims, array)``.
    The arrays are wrapped, not changed.
    """
    import xarray as xr

    return xr.Dataset({k: (tuple(dims), np.asarray(v)) for k, (dims, v) in variables.items()},
                      coords={k: np.asarray(v) for k, v in coords.items()})


__all__ = ["DATA_FILE", "GRIDS_FILE", "Result", "grid", "load_netcdf_groups", "save_netcdf_groups"]
