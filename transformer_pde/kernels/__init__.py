"""Pair reductions behind every attention variant (the kernels floor of the house).

- :mod:`.exact`: dense and exact streaming (blocked, flash-style) log-sum-exp reductions, with
  their layouts as values (:class:`Dense`, :class:`Streaming`, :class:`DenseOrStreaming`).
- :mod:`.spatial`: :class:`SpatialTiles`, a layout that sorts queries and keys along a Morton
  curve so that a reduction with a locality radius (Krause attention) skips far key tiles.
- :mod:`.fast`: the NUFFT Gaussian sum, O(n + M log M) for scores in R^k, k <= 3.
- :mod:`.reduction`: :class:`SoftmaxReduction`, the reduction an attention hands its backend,
  as a value.
- :mod:`.backends`: the strategies an attention takes as ``backend=``: :class:`Exact`,
  :class:`Fast`, :class:`Auto` (:func:`automatic`, ``Auto(radius=None)``, when an attention is
  given none), each computing the reductions it is handed (``backend.lse_average(reduction)``),
  with :class:`KernelReport`, the choice and its reason; plans refused above a memory budget
  (:class:`PlanTooLarge`, ``PLAN_MEMORY_BUDGET``);
  :mod:`.binding`: what a fast plan needs from the attention (:class:`ScoreBox`).
- :mod:`.platforms`: the platforms the installed jax-finufft serves (:func:`fast_platforms`,
  found without importing it).
- :mod:`.point_clouds`: ott-jax point clouds whose Sinkhorn kernel streams through :mod:`.exact`.
- :mod:`.random_partition`: the random batch method (random partitions into batches, and the
  field each token feels inside its batch).
"""

from . import backends, binding, exact, fast, platforms, random_partition, reduction, spatial
from .backends import AbstractBackend, Auto, Exact, Fast, KernelReport, automatic, bind_backend
from .binding import ScoreBox
from .exact import (
    DENSE_MAX_PAIRS,
    AbstractLayout,
    Dense,
    DenseOrStreaming,
    Streaming,
    exp_kernel_sum,
    log_weights,
    lse_average,
    sigmoid_kernel_sum,
    softmax_average,
)
from .fast import PLAN_MEMORY_BUDGET, PlanTooLarge
from .platforms import fast_platforms
from .reduction import SoftmaxReduction
from .spatial import SpatialTiles

__all__ = [
    "AbstractBackend",
    "AbstractLayout",
    "Auto",
    "Dense",
    "DenseOrStreaming",
    "Exact",
    "Fast",
    "KernelReport",
    "PLAN_MEMORY_BUDGET",
    "PlanTooLarge",
    "ScoreBox",
    "SoftmaxReduction",
    "automatic",
    "backends",
    "bind_backend",
    "binding",
    "fast",
    "DENSE_MAX_PAIRS",
    "exact",
    "platforms",
    "point_clouds",
    "random_partition",
    "reduction",
    "exp_kernel_sum",
    "fast_platforms",
    "log_weights",
    "lse_average",
    "sigmoid_kernel_sum",
    "softmax_average",
    "spatial",
    "SpatialTiles",
    "Streaming",
]


def __getattr__(name):
    # point_clouds subclasses ott-jax's PointCloud: importing ott (and scipy.stats, ~1-2 s) is left
    # to the runs that use Sinkhorn, not paid by every import of the kernels
    if name == "point_clouds":
        import importlib

        return importlib.import_module(f"{__name__}.point_clouds")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
