"""Clusters of points on the line: sort, and split where a gap between neighbours exceeds a
threshold (single linkage in one dimension). O(n log n) in NumPy, where the pairwise
:func:`~transformer_pde.diagnostics.cluster_count` holds an n × n adjacency (17 GB at n = 2¹⁶);
for tokens in one dimension the two agree (``tests/diagnostics/test_diagnostics.py``)."""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array, check_finite, check_scalar


def gap_clusters(x, gap) -> int:
    """Clusters of points on the line: split the sorted points where consecutive gaps exceed ``gap``."""
    x = check_finite(as_float_array(x, "x"), "x")
    gap = check_scalar(gap, "gap", nonnegative=True)
    xs = np.sort(np.asarray(x, dtype=float).ravel())
    return int(1 + np.sum(np.diff(xs) > gap))


__all__ = ["gap_clusters"]
