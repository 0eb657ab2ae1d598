"""Generic statistics of repeated measurements: power-law rates with bootstrap intervals.

:func:`fit_rate` fits err ∝ n^slope to errors measured at several sizes n over independent
seeds, and resamples the seeds for a percentile interval of the slope (:class:`RateFit`);
:func:`fit_log_law` fits value ≈ D + C ln n the same way (:class:`LogLawFit`). The
convergence study (:mod:`transformer_pde.convergence`) and its experiment use it; nothing here
knows about particles or mean fields.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._checks import check_count, check_in_range, check_int, check_real


@dataclasses.dataclass(frozen=True)
class RateFit:
    """log err ≈ intercept + slope · log n, fitted on the seed-averaged log errors.

    ``slope_ci`` is a bootstrap percentile interval (seeds resampled at every n);
    ``band(ns)`` gives the pointwise interval of the fitted line, for plots.
    """

    slope: float
    intercept: float
    slope_ci: tuple
    boot_slopes: np.ndarray
    boot_intercepts: np.ndarray
    level: float

    def predict(self, ns):
        return np.exp(self.intercept + self.slope * np.log(np.asarray(ns, dtype=float)))

    def band(self, ns):
        logn = np.log(np.asarray(ns, dtype=float))
        lines = self.boot_intercepts[:, None] + self.boot_slopes[:, None] * logn[None, :]
        a = (1 - self.level) / 2
        return np.exp(np.quantile(lines, a, axis=0)), np.exp(np.quantile(lines, 1 - a, axis=0))


def _ols(x, y):
    xm = x.mean()
    slope = np.sum((x - xm) * (y - y.mean())) / np.sum((x - xm) ** 2)
    return slope, y.mean() - slope * xm


def _seed_line(x, y, *, level, num_bootstrap, seed):
    """y ≈ intercept + slope · x fitted to the seed means of ``y`` (N, S), and its seed bootstrap:
    (slope, intercept, slope interval, bootstrap slopes, bootstrap intercepts)."""
    slope, intercept = _ols(x, y.mean(axis=1))
    rng = np.random.default_rng(seed)
    S = y.shape[1]
    idx = rng.integers(0, S, size=(num_bootstrap, x.size, S))
    boot_y = np.take_along_axis(y[None], idx, axis=2).mean(axis=2)  # (B, N)
    xm = x.mean()
    bs = ((x - xm)[None] * (boot_y - boot_y.mean(1, keepdims=True))).sum(1) / np.sum((x - xm) ** 2)
    bi = boot_y.mean(1) - bs * xm
    a = (1 - level) / 2
    ci = (float(np.quantile(bs, a)), float(np.quantile(bs, 1 - a)))
    return float(slope), float(intercept), ci, bs, bi


def _sizes_and_values(ns, values, what, level, num_bootstrap, seed):
    """Checked (ns, values as (N, S), num_bootstrap, seed)."""
    check_in_range(level, "level", low=0.0, high=1.0, low_open=True, high_open=True,
                   meaning="a confidence level")
    num_bootstrap = check_count(num_bootstrap, "num_bootstrap", minimum=1)
    seed = check_int(seed, "seed", minimum=0, maximum=None)
    ns = np.asarray(check_real(ns, "ns", positive=True), dtype=float)
    if ns.ndim != 1:
        raise ValueError(f"ns must be a 1-D array of particle counts, got shape {ns.shape}")
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        v = v[:, None]
    if v.shape[0] != ns.size or ns.size < 2:
        raise ValueError(f"{what} must have shape (len(ns), seeds) with len(ns) >= 2, got {v.shape} "
                         f"for {ns.size} particle counts")
    return ns, v, num_bootstrap, seed


def fit_rate(ns, errors, *, level: float = 0.95, num_bootstrap: int = 1000, seed: int = 0) -> RateFit:
    """Fit err ∝ n^slope to ``errors`` of shape ``(N, S)`` (N particle counts, S seeds).

    The line is fitted to the mean over seeds of log err at each n (a geometric mean, since
    errors are log-normal-ish across seeds); the interval comes from resampling the seeds.
    """
    ns, e, num_bootstrap, seed = _sizes_and_values(ns, errors, "errors", level, num_bootstrap, seed)
    if not np.all(np.isfinite(e)) or np.any(e <= 0):
        raise ValueError("errors must be finite and > 0 to fit a rate on a log scale")
    return RateFit(*_seed_line(np.log(ns), np.log(e), level=level, num_bootstrap=num_bootstrap, seed=seed),
                   level)


@dataclasses.dataclass(frozen=True)
class LogLawFit:
    """value ≈ intercept + slope · ln n, fitted on the seed means (a law such as T(n) = C ln n + D).

    ``slope_ci`` and ``intercept_ci`` are bootstrap percentile intervals (seeds resampled at
    every n); ``band(ns)`` the pointwise interval of the fitted line.
    """

    slope: float
    intercept: float
    slope_ci: tuple
    intercept_ci: tuple
    boot_slopes: np.ndarray
    boot_intercepts: np.ndarray
    level: float

    def predict(self, ns):
        return self.intercept + self.slope * np.log(np.asarray(ns, dtype=float))

    def band(self, ns):
        logn = np.log(np.asarray(ns, dtype=float))
        lines = self.boot_intercepts[:, None] + self.boot_slopes[:, None] * logn[None, :]
        a = (1 - self.level) / 2
        return np.quantile(lines, a, axis=0), np.quantile(lines, 1 - a, axis=0)


def fit_log_law(ns, values, *, level: float = 0.95, num_bootstrap: int = 1000, seed: int = 0) -> LogLawFit:
    """Fit value ≈ D + C ln n to ``values`` of shape ``(N, S)`` (N particle counts, S seeds), e.g.
    a phase length; the line goes through the seed means (arithmetic: the values are times, not
    errors), the intervals come from resampling the seeds."""
    ns, v, num_bootstrap, seed = _sizes_and_values(ns, values, "values", level, num_bootstrap, seed)
    if not np.all(np.isfinite(v)):
        raise ValueError("values must be finite to fit a law in ln n")
    slope, intercept, ci, bs, bi = _seed_line(np.log(ns), v, level=level, num_bootstrap=num_bootstrap, seed=seed)
    a = (1 - level) / 2
    ici = (float(np.quantile(bi, a)), float(np.quantile(bi, 1 - a)))
    return LogLawFit(slope, intercept, ci, ici, bs, bi, level)


__all__ = ["LogLawFit", "RateFit", "fit_log_law", "fit_rate"]
