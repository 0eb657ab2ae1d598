"""Execute a notebook of ``notebooks/`` at its small size (TP_NOTEBOOK_SIZE=small), with nbclient."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_notebook(name: str, monkeypatch, timeout: int = 600):
    nbformat = __import__("pytest").importorskip("nbformat")
    nbclient = __import__("pytest").importorskip("nbclient")
    monkeypatch.setenv("TP_NOTEBOOK_SIZE", "small")
    # the kernel must import this checkout, not whatever transformer_pde is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    return nb
