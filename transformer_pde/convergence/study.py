r"""The study: n-particle systems for every n and seed against a law's mean-field reference, the
errors at chosen times (the package docstring)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Sequence

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from .._checks import INT_LIMIT, check_count, check_scalar
from ..diagnostics.study_distances import AbstractStudyDistance, SinkhornDistance
from ..models.base import AbstractDynamics
from ..statistics import RateFit, fit_rate
from .laws import mean_field_reference
from .metrics import METRICS
from .references import AbstractMeanFieldReference
from .runner import StudySpec


def _positive(value, name: str) -> float:
    """A finite real number > 0, as a float (ValueError naming ``name`` otherwise)."""
    return float(check_scalar(value, name, positive=True))


@dataclasses.dataclass(frozen=True)
class ConvergenceResult:
    """Errors of n-particle systems against the mean field.

    Attributes:
        ns: particle counts ``(N,)``; seeds ``(S,)``; ts: measurement times ``(T,)``.
        errors: metric name -> array ``(N, S, T)`` (see the module docstring; ``w2`` is NaN
            where it was not computed).
        dim: the dimension d (for the n^{-1/d} comparison).
        reference: the mean field compared with (:func:`mean_field_reference`; ``str`` of it
            reads ``gaussian``, ``stationary``, ``particles(n_ref)`` or ``quadrature(...)``).
        distance: the transport distance measured (``str`` states it, with the Sinkhorn ε).
        unconverged: ``(N,)`` how many Sinkhorn distances of each n did not converge (NaN).
        reference_error: metric name -> ``(N, S, T)``, the estimated error of the reference in
            each measurement of ``errors`` (quadrature: the change of the measured value when the
            reference is replaced by its coarser rule; 0: exact up to the time stepping; NaN: not
            estimated, the particle reference).
    """

    ns: np.ndarray
    seeds: np.ndarray
    ts: np.ndarray
    errors: dict
    dim: int
    reference: AbstractMeanFieldReference
    distance: AbstractStudyDistance | None = None
    unconverged: np.ndarray | None = None
    reference_error: dict | None = None

    def rates(self, metric: str, time_index: int = -1, **kwargs) -> RateFit:
        """Log-log fit of ``errors[metric][:, :, time_index]`` against n
        (:func:`transformer_pde.statistics.fit_rate`)."""
        return fit_rate(self.ns, self.errors[metric][:, :, time_index], **kwargs)


def _integers(values, name: str, *, minimum: int, maximum: int = INT_LIMIT) -> list[int]:
    """A 1-D sequence of integers (a list, tuple, range, 1-D array; integral floats allowed):
    ValueError naming ``name`` (or ``name[i]``) for a scalar, a string or a bad element."""
    if isinstance(values, (np.ndarray, jax.Array)):
        if values.ndim != 1:
            raise ValueError(f"{name} must be a 1-D sequence of integers, got an array of shape {values.shape}")
        items = list(np.asarray(values))
    elif isinstance(values, Iterable) and not isinstance(values, (str, bytes, dict)):
        items = list(values)
    else:
        raise ValueError(f"{name} must be a sequence of integers (a list, tuple, range or 1-D array), got "
                         f"{type(values).__name__} {values!r}"[:300])
    return [check_count(v, f"{name}[{i}]", minimum=minimum, maximum=maximum) for i, v in enumerate(items)]


def _float_dtype(dtype):
    """A floating dtype JAX computes in (default: JAX's float), ValueError naming ``dtype``."""
    if dtype is None:
        return jnp.dtype(jnp.result_type(float))
    try:
        dt = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be a floating dtype (float32, float64), got {dtype!r}") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype (float32, float64), got {dt}")
    if jax.dtypes.canonicalize_dtype(dt) != dt:
        raise ValueError(f"dtype={dt} needs jax_enable_x64 (JAX would compute in float32)")
    return dt


def _times(ts, t1: float) -> np.ndarray:
    """The measurement times: default ``[0, t1]``; else a non-empty 1-D sequence of finite,
    non-decreasing times in [0, t1] (ValueError naming ``ts`` otherwise)."""
    if ts is None:
        return np.asarray([0.0, t1], dtype=np.float64)
    try:
        out = np.asarray(ts, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"ts must be a 1-D sequence of times in [0, t1={t1}], got {ts!r}"[:300]) from None
    if out.ndim != 1 or out.size < 1:
        raise ValueError(f"ts must be a non-empty 1-D sequence of times in [0, t1={t1}], got shape {out.shape}")
    if not np.all(np.isfinite(out)):
        raise ValueError(f"ts must be finite times in [0, t1={t1}], got {out.tolist()}"[:300])
    if np.any(np.diff(out) < 0) or out[0] < 0 or out[-1] > t1 * (1 + 1e-9):
        raise ValueError(f"ts must be non-decreasing times in [0, t1={t1}], got {out.tolist()}"[:300])
    return out


def convergence_study(
    dynamics: AbstractDynamics,
    law,
    ns: Sequence[int] | ArrayLike,
    *,
    t1: float,
    dt0: float,
    ts=None,
    seeds: Sequence[int] = (0, 1, 2, 3),
    n_ref: int | None = None,
    w2_epsilon: float = 0.01,
    w2_max_n: int = 4096,
    w2_max_iterations: int = 2000,
    w2_threshold: float = 1e-4,
    solver: diffrax.AbstractSolver | None = None,
    dtype=None,
    progress: Callable[[str], None] | None = None,
) -> ConvergenceResult:
    """Run n-particle systems for every n in ``ns`` and seed, and measure their distance to
    the mean field at times ``ts`` (the package docstring).

    Args:
        dynamics: an attention with a Gaussian closure (``law`` a :class:`Gaussian`), any
            dynamics for which ``law`` is a :class:`StationaryLaw`, or any dynamics with a field at
            arbitrary points (``law`` a sampler ``(key, n) -> (n, d)``, compared with an
            ``n_ref``-particle reference).
        law: :class:`Gaussian`, :class:`StationaryLaw`, :class:`QuadratureLaw` (the
            deterministic reference, any dynamics) or a sampler.
        ns: particle counts (e.g. ``2 ** np.arange(6, 17)``).
        t1, dt0: horizon and constant step of the solver (default Tsit5).
        ts: measurement times in [0, t1] (default ``[0, t1]``; include 0 to see the sampling
            error at t = 0).
        seeds: the initial samples of seed s use ``jax.random.key(s)``; the same key drives the
            particles and their tracers (same-seed coupling).
        n_ref: size of the reference system (particle laws only; default 8 · max(ns)).
        w2_epsilon: ε of the Sinkhorn divergence relative to the data's scale: ε = w2_epsilon ·
            tr Cov of the reference measure at each time (:class:`SinkhornDistance`). Not used on
            R and S¹, where the distances are exact (``w1``, ``w2`` on R; ``w1`` on S¹).
        w2_max_n: skip the Sinkhorn ``w2`` (NaN) above this n (an integer >= 0): it costs O(n²)
            per iteration.
        w2_max_iterations, w2_threshold: the Sinkhorn budget; an unconverged distance is NaN,
            counted in :attr:`ConvergenceResult.unconverged` and warned about (the study goes on).
        solver: a diffrax solver (default Tsit5), run at the constant step ``dt0``.
        dtype: the floating dtype of the systems and the references (default JAX's float:
            float64 under ``jax_enable_x64``, float32 otherwise; float64 needs x64).
        progress: called with a line of text after every n.

    Every system is run with one :class:`~transformer_pde.convergence.runner.StudySpec` (times,
    step, solver, distance), beside the reference the law gives (:func:`mean_field_reference`).
    """
    ns = np.asarray(sorted(set(_integers(ns, "ns", minimum=2))))
    if ns.size < 1:
        raise ValueError(f"ns must hold particle counts >= 2, got {ns.tolist()}")
    seeds = _integers(seeds, "seeds", minimum=0, maximum=2**32 - 1)
    if len(set(seeds)) != len(seeds):
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ValueError(f"seeds must be distinct (each is one independent sample; a repeat would "
                         f"narrow the band), got {twice} more than once")
    if n_ref is not None:
        n_ref = check_count(n_ref, "n_ref", minimum=2)
        if n_ref < ns[-1]:
            raise ValueError(f"n_ref={n_ref} must be at least the largest n={int(ns[-1])} (the "
                             f"reference stands in for the mean-field limit)")
    t1, dt0 = _positive(t1, "t1"), _positive(dt0, "dt0")
    if len(seeds) < 1:
        raise ValueError("need at least one seed")
    sinkhorn = SinkhornDistance(_positive(w2_epsilon, "w2_epsilon"),
                                check_count(w2_max_iterations, "w2_max_iterations", minimum=1),
                                _positive(w2_threshold, "w2_threshold"))
    w2_max_n = check_count(w2_max_n, "w2_max_n", minimum=0, maximum=None)
    dtype = _float_dtype(dtype)
    ts = _times(ts, t1)
    solver = diffrax.Tsit5() if solver is None else solver
    keys = jnp.stack([jax.random.key(int(s)) for s in seeds])
    t1a, dt0a, tsa = (jnp.asarray(v, dtype) for v in (t1, dt0, ts))
    max_steps = int(np.ceil(float(t1) / float(dt0) * (1 + 1e-6))) + 1
    errors = {k: np.zeros((ns.size, len(seeds), ts.size)) for k in METRICS}
    unconverged = np.zeros(ns.size, dtype=int)
    reference = mean_field_reference(dynamics, law, n_ref or min(8 * int(ns[-1]), INT_LIMIT), dtype)
    distance = reference.distance(dynamics, sinkhorn)
    spec = StudySpec(tsa, t1a, dt0a, solver, distance, w2_max_n, max_steps)
    reference_error = {k: np.zeros((ns.size, len(seeds), ts.size)) for k in METRICS}
    for i, n in enumerate(ns):
        out, ref_err = reference.run(dynamics, keys, int(n), spec)
        for k in METRICS:
            errors[k][i] = np.asarray(out[k], dtype=np.float64)
            reference_error[k][i] = np.asarray(ref_err[k], dtype=np.float64)
        unconverged[i] = int(np.sum(np.asarray(out["unconverged"])))
        if unconverged[i]:
            warnings.warn(f"n={n}: {unconverged[i]} of {len(seeds) * ts.size} Sinkhorn distances did not "
                          f"converge ({distance}); they are reported as NaN (raise w2_max_iterations or "
                          "w2_epsilon)", RuntimeWarning, stacklevel=2)
        if progress is not None:
            progress(f"n={n}: " + ", ".join(f"{k}={np.nanmean(errors[k][i, :, -1]):.3g}"
                                           for k in METRICS if np.isfinite(errors[k][i, :, -1]).any())
                     + (f" ({unconverged[i]} unconverged)" if unconverged[i] else ""))
    return ConvergenceResult(ns=ns, seeds=np.asarray(seeds), ts=ts, errors=errors, dim=reference.dim,
                             reference=reference, distance=distance, unconverged=unconverged,
                             reference_error=reference_error)


def geometric_ns(lo: int, hi: int, step: int = 1) -> np.ndarray:
    """Powers of two 2^lo, 2^(lo + step), ..., up to 2^hi (1 <= lo <= hi <= 30: JAX counts in int32)."""
    lo = check_count(lo, "lo", minimum=1, maximum=30)
    hi = check_count(hi, "hi", minimum=lo, maximum=30)
    step = check_count(step, "step", minimum=1)
    return 2 ** np.arange(lo, hi + 1, step)


__all__ = ["ConvergenceResult", "convergence_study", "geometric_ns"]
