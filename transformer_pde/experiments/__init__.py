"""Published experiments, one module each (the computation: compute and figures, with ordinary
imports), and for each a light entry in :mod:`.configs` (its options dataclass, summary and tiny
size) that registers it on import (:data:`REGISTRY` imports an entry when its name is first looked
up, and all of them when they are listed).

Adding an experiment is adding its module here and its entry in ``configs/`` that calls
:func:`register`; the command line, ``transformer-pde list`` and the test suite pick it up without
further edits. The entries load no JAX: ``list`` and ``--help`` import none, and an experiment's
module is imported when its ``compute`` or ``figures`` is first called.
"""

from ..runs.result import Result
from ._base import REGISTRY, Deferred, Experiment, get, register

__all__ = ["REGISTRY", "Experiment", "Result", "Deferred", "get", "register"]
