"""What a run saves: :class:`Result`, named arrays (``data.npz``) plus labelled grids (``results.nc``).

``Result.arrays`` are the numbers of the run, saved to ``data.npz`` under their names (one
``.npy`` member each, deterministic bytes). ``Result.grids`` are the same numbers where they
form grids (β × d × seed × t, ...), as :class:`xarray.Dataset` s whose dimensions are named
after the swept axes and whose coordinates are the swept values, saved beside the data as
``results.nc`` (netCDF-4), so a run opens with the tools people already use:

* a run with one grid stores it as the file's root dataset::

      xr.open_dataset("runs/sweep-phase/results.nc")             # the grid "sweep"

* a run with several grids stores each as a netCDF group named after it, and the root dataset
  lists them (coordinate ``grids``), so opening the file without a group shows what to open::

      xr.open_dataset("runs/kde-modes/results.nc")                # grids: "modes", "dynamics"
      xr.open_dataset("runs/kde-modes/results.nc", group="modes")

``transformer-pde info RUN_DIR`` prints which (and every array of ``data.npz``);
``Result.load(run_dir)`` (``tp.Result.load``) reads both files back, and ``transformer-pde
plot RUN_DIR`` redraws the figures from it without recomputing.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._io import FILE_MODE, atomic_write_bytes, result_array, save_npz
from .layout import (
    CORRUPT_FILE_ERRORS,
    DATA_FILE,
    GRIDS_FILE,
    OWN_FILES,
    STATUS_COMPLETE,
    error_text,
    read_metadata,
)

if TYPE_CHECKING:  # xarray is imported when grids are built or read
    import xarray as xr

NETCDF_ENGINE = "h5netcdf"
GRID_NAME_ATTR = "grid"
"""Attribute of a root-stored grid that keeps its name (removed again on reading)."""
INDEX = "grids"
"""The root coordinate that lists the groups of a file of several grids (so no grid has this name)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Result(Mapping):
    """Named arrays (``data.npz``) and labelled grids (``results.nc``) of one run.

    Reads like a read-only dict of the arrays (``result["ts"]``), so figures and tests index
    it by name; ``result.grids["sweep"]["t_one"].sel(d=3)`` is the labelled view.
    ``Result.load(run_dir)`` reads a run's saved result (layout of ``results.nc``: this
    module's docstring).

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
            if not isinstance(name, str) or not name.isidentifier() or name == INDEX:
                raise ValueError(f"grid names must be identifiers (netCDF groups) other than {INDEX!r}, "
                                 f"got {name!r}")
            if type(ds).__name__ != "Dataset":  # xarray is not imported to ask isinstance
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
        paths written. Nothing else is touched (a run removes the files of the run it replaces
        before computing: :func:`~transformer_pde.runs.directory.clear_run`)."""
        run_dir = Path(run_dir)
        save_npz(run_dir / DATA_FILE, self.arrays)
        written = [run_dir / DATA_FILE]
        nc = run_dir / GRIDS_FILE
        if self.grids:
            save_grids(nc, self.grids)
            written.append(nc)
        return written

    @staticmethod
    def write_table(run_dir, name: str, text: str) -> Path:
        """Write an extra table or report beside the result (``errors.csv``, ``report.txt``),
        atomically; returns its path. A figures function calls it, so ``transformer-pde plot``
        writes it again from the saved result; list the path among the figures it returns so a
        run that replaces this one removes it. ``name`` is a plain file name other than the
        run's own files."""
        if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name \
                or name in OWN_FILES:
            raise ValueError(f"Result.write_table: name must be a plain file name other than "
                             f"{', '.join(OWN_FILES)}, got {name!r}"[:300])
        if not isinstance(text, str):
            raise ValueError(f"Result.write_table: text must be a str, got {type(text).__name__}")
        path = Path(run_dir) / name
        atomic_write_bytes(path, text.encode())
        return path

    @classmethod
    def load(cls, run_dir) -> Result:
        """The result saved in ``run_dir``: its ``data.npz``, and ``results.nc`` where the run
        has grids. Where ``run_dir`` holds a run's ``metadata.json``, the run must be complete
        (a failed or running run's files are not its result) and ``results.nc`` is read only
        if the metadata lists grids. Raises ValueError naming the file for anything else: no
        such file, not a regular file, damaged or unreadable (never NumPy's or h5py's own error)."""
        if not isinstance(run_dir, (str, os.PathLike)):
            raise ValueError(f"Result.load: run_dir must be a path, got {type(run_dir).__name__} {run_dir!r}"[:300])
        run_dir = Path(run_dir)
        meta = read_metadata(run_dir)
        if meta is not None and meta["status"] != STATUS_COMPLETE:
            raise ValueError(f"the run in {str(run_dir)!r} is not complete (status {meta['status']!r}): its "
                             f"files are not its result; finish it with transformer-pde run --resume {run_dir}")
        path = run_dir / DATA_FILE
        if not path.exists():
            raise ValueError(f"{str(run_dir)!r} holds no {DATA_FILE} (not a complete run)")
        nc = run_dir / GRIDS_FILE
        with_grids = nc.exists() if meta is None else bool(meta.get("grid_names") or meta.get("grids"))
        for f in [path, nc] if with_grids else [path]:
            if not f.is_file():
                what = "is missing" if not f.exists() else "is not a file"
                raise ValueError(f"{f} {what}; the run's saved result is damaged: run it again")
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except CORRUPT_FILE_ERRORS as e:
            raise ValueError(f"{path} is unreadable ({error_text(e)}); the run's saved result is damaged: "
                             f"run it again") from None
        try:
            grids = load_grids(nc) if with_grids else {}
        except (*CORRUPT_FILE_ERRORS, RuntimeError) as e:  # h5py/netCDF errors are OSError or RuntimeError
            raise ValueError(f"{nc} is unreadable ({error_text(e)}); the run's saved result is damaged: "
                             f"run it again") from None
        return cls(arrays, grids)


def save_grids(path: Path, datasets: Mapping[str, "xr.Dataset"]) -> None:
    """Datasets as one netCDF-4 file, written to a temporary file and renamed: one dataset as
    the root (its name in the attribute :data:`GRID_NAME_ATTR`), several as groups named after
    them under a root that lists them (coordinate :data:`INDEX`)."""
    import xarray as xr

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if len(datasets) == 1:
            (name, ds), = datasets.items()
            ds.assign_attrs({GRID_NAME_ATTR: name}).to_netcdf(tmp, mode="w", engine=NETCDF_ENGINE)
        else:
            index = xr.Dataset(coords={INDEX: np.asarray(list(datasets))}, attrs={
                "description": f"several grids, one netCDF group each: open one with "
                               f"xarray.open_dataset(path, group=NAME), NAME in {INDEX}"})
            index.to_netcdf(tmp, mode="w", engine=NETCDF_ENGINE)
            for name, ds in datasets.items():
                ds.to_netcdf(tmp, mode="a", group=name, engine=NETCDF_ENGINE)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_grids(path: Path) -> dict[str, "xr.Dataset"]:
    """The grids of a ``results.nc`` written by :func:`save_grids`, loaded into memory."""
    import xarray as xr

    groups = xr.open_groups(path, engine=NETCDF_ENGINE)
    try:
        named = {name.strip("/"): ds.load() for name, ds in groups.items() if name != "/"}
        if named:
            return named
        root = groups["/"].load()
        name = root.attrs.pop(GRID_NAME_ATTR, None)
        if not isinstance(name, str):
            raise ValueError(f"{path} holds neither groups nor a named root grid (attribute "
                             f"{GRID_NAME_ATTR!r})")
        return {name: root}
    finally:
        for ds in groups.values():
            ds.close()


def grid(coords: Mapping[str, np.ndarray], *, describe: Mapping[str, tuple[str, str]] | None = None,
         **variables) -> "xr.Dataset":
    """A Dataset from NumPy arrays: ``grid({"beta": b, "t": ts}, fraction=(("beta", "t"), f))``.

    ``coords`` names the dimensions and gives their values; each variable is ``(dims, array)``.
    The arrays are wrapped, not changed. ``describe`` maps a variable or coordinate name to
    ``(description, units)`` (units ``""`` for a pure number), written as the netCDF
    attributes ``description`` and ``units`` so the file says what each number is.
    """
    import xarray as xr

    ds = xr.Dataset({k: (tuple(dims), np.asarray(v)) for k, (dims, v) in variables.items()},
                    coords={k: np.asarray(v) for k, v in coords.items()})
    for name, pair in (describe or {}).items():
        if name not in ds.variables:
            raise ValueError(f"grid: describe names {name!r}, which is neither a variable nor a coordinate "
                             f"(they are {', '.join(map(str, ds.variables))})")
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise ValueError(f"grid: describe[{name!r}] must be (description, units), two strings, got {pair!r}")
        ds[name].attrs.update(description=pair[0], units=pair[1])
    return ds


__all__ = ["DATA_FILE", "GRIDS_FILE", "Result", "grid", "load_grids", "save_grids"]
