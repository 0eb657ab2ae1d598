r"""Rate tables of a study: fitted slopes of log error against log n beside the rates the theory
gives (the fits: :func:`transformer_pde.statistics.fit_rate`)."""

from __future__ import annotations

import numpy as np

from .._checks import check_count, check_int
from ..statistics import fit_rate
from .metrics import METRICS
from .study import ConvergenceResult


def reference_rates(d: int) -> dict:
    """The rates to compare with: Monte Carlo n^{-1/2} and the empirical W_2 rate n^{-1/d}
    (n^{-1/2} up to logs for d <= 2)."""
    d = check_count(d, "d", minimum=1)
    return {"monte_carlo": -0.5, "empirical_w2": -1.0 / max(d, 2)}


def rate_table(result: ConvergenceResult, metrics=None, time_index: int = -1) -> list[dict]:
    """One row per metric: fitted slope, its interval, and the reference rates."""
    if not isinstance(result, ConvergenceResult):
        raise ValueError(f"result must be a ConvergenceResult (from convergence_study), got {type(result).__name__}")
    num_times = len(result.ts)
    time_index = check_int(time_index, "time_index", minimum=-num_times, maximum=num_times - 1)
    if metrics is None or (isinstance(metrics, (list, tuple)) and not metrics):
        metrics = [k for k in METRICS if k in result.errors]
    if isinstance(metrics, str) or not all(isinstance(k, str) and k in result.errors for k in metrics):
        raise ValueError(f"metrics must be a sequence of the result's metric names {sorted(result.errors)}, "
                         f"got {metrics!r}")
    rows = []
    for k in metrics:
        e = result.errors[k][:, :, time_index]
        if not np.all(np.isfinite(e)) or np.any(e <= 0):
            keep = np.all(np.isfinite(e) & (e > 0), axis=1)
            if keep.sum() < 2:
                continue
            fit = fit_rate(result.ns[keep], e[keep])
        else:
            fit = fit_rate(result.ns, e)
        rows.append({"metric": k, "t": float(result.ts[time_index]), "slope": fit.slope,
                     "slope_low": fit.slope_ci[0], "slope_high": fit.slope_ci[1],
                     **reference_rates(result.dim)})
    return rows


__all__ = ["rate_table", "reference_rates"]
