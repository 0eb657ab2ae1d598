"""Published experiments, one module each (the computation: compute and figures, with ordinary
imports), and for each a light entry in :mod:`.configs` (its options dataclass, summary and tiny
size) that registers it on import.

Adding an experiment is adding its module here and its entry in ``configs/`` that calls
:func:`register`; the command line, ``transformer-pde list`` and the test suite pick it up without
further edits. Importing this package imports the entries only: ``list`` and ``--help`` load no JAX,
and an experiment's module is imported when its ``compute`` or ``figures`` is first called.
"""

import importlib
import pkgutil

from ..runs.result import Result
from . import configs
from ._base import REGISTRY, Deferred, Experiment, get, register

for _info in pkgutil.iter_modules(configs.__path__):
    importlib.import_module(f"{configs.__name__}.{_info.name}")

__all__ = ["REGISTRY", "Experiment", "Result", "Deferred", "get", "register"]
