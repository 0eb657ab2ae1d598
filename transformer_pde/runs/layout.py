"""The names of a run directory's files and statuses, and reading its ``metadata.json``: what
both the run directory (:mod:`.directory`) and a saved result (:mod:`.result`) need. Imports
nothing of this package."""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

DATA_FILE = "data.npz"
GRIDS_FILE = "results.nc"
METADATA_FILE = "metadata.json"
CHECKPOINT_DIR = "checkpoints"
RUN_IDENTITY_FILE = "run.json"

STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_FAILED, STATUS_COMPLETE = (
    "running", "interrupted", "failed", "complete")
STATUSES = (STATUS_RUNNING, STATUS_INTERRUPTED, STATUS_FAILED, STATUS_COMPLETE)

#: What reading a damaged ``.npz`` / ``.nc`` / JSON file raises (truncated, bit-flipped,
#: replaced by another file): a BadZipFile, a zlib error, an EOFError, numpy's ValueErrors
#: ("pickled data", a bad header), OSError, a missing member (KeyError).
CORRUPT_FILE_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def error_text(e: BaseException) -> str:
    """``"Type: message"`` on one line."""
    text = " ".join(str(e).split())
    if isinstance(e, ValueError) and "pickle" in text:  # numpy's advice to unpickle: never here
        text = "not an archive of arrays: NumPy reads it as pickled data, which is never loaded"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


CONFIG_FILES = ("config.json", "config.toml")
OWN_FILES = (METADATA_FILE, *CONFIG_FILES, DATA_FILE, GRIDS_FILE)
"""The files a run writes under fixed names (besides its figures and its checkpoints)."""


def read_metadata(out_dir: Path) -> dict | None:
    """The ``metadata.json`` of ``out_dir`` (None when there is none).

    Raises ValueError when ``out_dir`` is not a directory, or the file is unreadable or is not
    the metadata of a run (a JSON object naming its experiment, options and status)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{str(out_dir)!r} is not a directory")
    path = out_dir / METADATA_FILE
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
        _check_depth(meta)
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too deep
        raise ValueError(f"{path} is unreadable ({error_text(e)}); not an output directory of "
                         "transformer-pde, or a damaged one") from None
    problem = None
    if not isinstance(meta, dict):
        problem = f"a JSON object was expected, found {type(meta).__name__}"
    elif not isinstance(meta.get("experiment"), str):
        problem = f"it names no experiment (experiment = {meta.get('experiment')!r})"
    elif meta.get("status") not in STATUSES:
        problem = f"unknown status {meta.get('status')!r} (one of {', '.join(STATUSES)})"
    elif not isinstance(meta.get("config", {}), dict):
        problem = f"its config is not a table of options ({type(meta['config']).__name__})"
    if problem:
        raise ValueError(f"{path} is not the metadata of a run: {problem}")
    return meta


MAX_DEPTH = 16
"""How deeply a run's metadata nests (it nests 3 levels); deeper is not the metadata of a run."""


def _check_depth(obj) -> None:
    """ValueError for JSON nested deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)



__all__ = ["CHECKPOINT_DIR", "CONFIG_FILES", "CORRUPT_FILE_ERRORS", "DATA_FILE", "GRIDS_FILE", "MAX_DEPTH",
           "METADATA_FILE", "OWN_FILES", "RUN_IDENTITY_FILE", "STATUSES", "STATUS_COMPLETE", "STATUS_FAILED",
           "STATUS_INTERRUPTED", "STATUS_RUNNING", "error_text", "read_metadata"]
