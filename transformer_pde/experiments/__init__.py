"""Published experiments, one module each; every module registers itself on import.

Adding an experiment is adding a module here that calls :func:`register`; the command
line, ``transformer-pde list`` and the test suite pick it up without further edits.
"""

import importlib
import pkgutil

from ..runs.result import Result
from ._base import REGISTRY, Experiment, get, register

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["REGISTRY", "Experiment", "Result", "get", "register"]
