r"""Kernel backends: how an attention reduces its query-key pairs, as strategy values.

An attention whose field is made of softmax reductions of logits $\gamma\langle a_i,b_j\rangle
+\mathrm{bias}_j$ (softmax, multi-head per head, ℓ², USA, Sinkhorn; $a=Qx$, $b=Ky$ in $\mathbb
R^k$) takes ``backend=``, and hands it each reduction as a value
(:class:`~.reduction.SoftmaxReduction`): ``backend.lse_average(reduction)`` returns the average
and the log-normalizer, whichever kernel computes them. The backends are

* :class:`Exact`: the dense / exact streaming kernel of :mod:`.exact`, any k, causal
  included. ``Exact(layout)`` sets how it visits the pairs (:class:`~.exact.Dense`,
  :class:`~.exact.Streaming` blocks, or :class:`~.exact.DenseOrStreaming` by size, the default).
* :class:`Fast`: the NUFFT Gaussian sum of :mod:`.fast`, forced (k <= 3, non-causal). Its error
  is planned a priori (``tol`` relative to the total mass, see below); a state outside the box
  it was planned for, or a β outside its window, raises.
* :class:`Auto`: the fast kernel where it is predicted cheaper and accurate, the exact one
  otherwise, with the choice and its reason inspectable (:class:`KernelReport`,
  ``attn.kernel_report(x)``), and a run-time fallback to the exact kernel for every query whose
  a-posteriori bound misses ``tol``: it never returns an answer whose bound exceeds ``tol``.

**The default** (no ``backend=``) is :func:`automatic`, ``Auto(radius=None)``: it assumes no
bound on the tokens, so it is :class:`Exact` in R^d, but ``tp.Sphere`` / ``tp.PostLN`` declare
|x| <= 1.25 (``AbstractDynamics.with_token_radius``) and it then takes the fast kernel where
:class:`Auto` would (k <= 3, float64, n >= 4096 for softmax on S² at β = 1; n = 256 stays exact).
The choice is static; ``backend=Exact()`` forces the exact kernel.

**Budget and platform.** A plan's working memory (:func:`~.fast.plan_memory_bytes`) is computed
before it is built: above ``max_plan_bytes`` (default :data:`~.fast.PLAN_MEMORY_BUDGET`, 1 GiB)
:class:`Fast` raises :class:`~.fast.PlanTooLarge` (naming the modes, the grid, β and the budget)
and :class:`Auto` takes the exact kernel. The NUFFT runs on the platforms the installed
jax-finufft was built for (:func:`~.platforms.fast_platforms`: PyPI's wheels are CPU-only);
elsewhere :class:`Auto` is exact and :class:`Fast` raises naming what to install.

**What a plan needs before tracing.** The NUFFT's mode count fixes array shapes, so the plan is
static: it needs a box $|a|_\infty,|b|_\infty\le R$ and a window for γ before ``jit`` traces the
model (inside ``tp.solve`` the parameters are tracers). The attention works both out *when it is
built*, from its concrete parameters and the backend's declarations (:class:`ScoreBox`):

* ``radius`` declares $|x|_2\le r$ for every token and query over the whole run (1 under
  ``tp.Sphere``, the default). Then $|(Qx)_r|=|\langle Q_r,x\rangle|\le|Q_r|\,r$, so
  $R=r\max(\max_r|Q_r|,\max_r|K_r|)$ (rows of every head and every layer of a
  ``PiecewiseConstant``); ``score_radius=R`` declares R directly (needed for a callable Q, K, or
  one traced at construction).
* γ is β (softmax, multi-head, USA), 2β (ℓ², whose kernel is $e^{-\beta|Qx-Ky|^2}$) or β/ε
  (Sinkhorn). A concrete β at construction gives the window [γ, γ]; ``beta=(lo, hi)`` declares a
  window when β moves (a fit, a sweep that builds the model under ``vmap``): the plan then holds
  for every β in it (aliasing is planned at the smallest γ, truncation at the largest).

A box or window that the run leaves is detected, never silently wrong: :class:`Fast` raises
(``eqx.error_if``, naming R and where it came from); :class:`Auto` recomputes those queries
exactly.

**Errors.** With $\eta$ = ``plan.eta`` and $\rho_i=U/D_i$ the inverse share of the (shifted)
mass seen by query i (:mod:`.fast`), each average is within $2V\eta\rho_i$ of the exact one ($V$
the half-range of the averaged values) and each log-normalizer within $-\log(1-\eta\rho_i)$.
:class:`Fast` plans $\eta=$ ``tol``. :class:`Auto` plans $\eta=\mathrm{tol}/(2\rho_\star)$ for a
budget $\rho_\star$ (``mass_ratio``, default $4(1+\gamma R^2)$, about twice the $\rho$ of tokens
spread uniformly over a sphere of radius R in score space), so that a query with $\rho_i\le\rho_\star$
meets ``tol``; every query whose computed bound (:class:`~.fast.FastSumInfo`) exceeds ``tol``
(the average's in units of $\max(1,V)$) is recomputed with the exact kernel: up to
``PATCH_ROWS`` such rows alone, more by the exact kernel for all rows (``jax.lax.switch``; under
``vmap`` every branch runs, so prefer :class:`Fast` inside ``vmap``; an attention's heads go
through :meth:`AbstractBackend.over_heads`, which loops over them on the fast backends).

**Devices.** With ``axis_name`` (inside ``shard_map``) a reduction holds this device's keys:
:class:`Exact` all-gathers them (every device then holds every key), the fast kernel sums its
Fourier modes across devices and gathers nothing of size n (:mod:`.fast`).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import warnings
from numbers import Real

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import runtime_check
from . import exact
from .binding import ScoreBox, score_box
from .exact import DEFAULT_LAYOUT, AbstractLayout
from .fast import (
    PLAN_MEMORY_BUDGET,
    GaussianSumPlan,
    PlanTooLarge,
    fast_lse_average_with_info,
    plan_gaussian_sum,
)
from .platforms import current_platform, fast_platforms, no_fast_path_message
from .reduction import SoftmaxReduction, gather_keys, keys_over_devices

__all__ = [
    "AbstractBackend",
    "Auto",
    "Exact",
    "Fast",
    "KernelReport",
    "PATCH_ROWS",
    "PLAN_MEMORY_BUDGET",
    "PlanTooLarge",
    "ScoreBox",
    "automatic",
    "bind_backend",
]

# Queries recomputed one by one (an exact m' x n reduction) before Auto recomputes all of them.
PATCH_ROWS = 1024
"""Queries whose fast-kernel error is patched by exact recomputation, one by one, before Auto
recomputes all of them exactly."""
# Auto takes the fast kernel only when the plan's predicted flop ratio (exact / fast) reaches
# this, per dtype. The flop model is a poor clock, in opposite directions per dtype (2-core CPU,
# k = 2-3, n = 3e3-1e5, benchmarks/README.md "Fast kernel"): in float64 the exact kernel's
# exp is ~8x slower than in float32, so measured speedups were 3-9x the predicted ratio; in
# float32 they were 0.03-0.7x of it (spreading is memory-bound, the float32 exact kernel fast).
MIN_SPEEDUP = {"float64": 1.0, "float32": 4.0}
# Below this many points (queries + keys) FINUFFT runs on one thread unless ``nthreads`` is
# set: its OpenMP start-up and barriers cost ~0.1-0.2 s per transform on a loaded 2-core
# machine, against milliseconds of work (measured at n = 300-3000).
SMALL_PROBLEM = 100_000
_MAX_K = 3


class KernelReport(eqx.Module):
    """The kernel an attention uses for a problem size, and why (``attn.kernel_report(x)``).

    Attributes:
        path: ``"fast"`` (NUFFT Gaussian sum) or ``"exact"`` (dense / streaming).
        reason: why, in words.
        backend: the backend's class name.
        plan: the :class:`~.fast.GaussianSumPlan` (fast path), else None.
        predicted_speedup: exact flops / fast flops (a flop ratio; measured times are in
            benchmarks/README.md), where a plan exists.
        predicted_error: the a-priori bound on one query's error (the average's in units of
            max(1, V); the log-normalizer's) for queries with ρ_i <= ``mass_ratio``: 2 ρ⋆ η.
        mass_ratio: ρ⋆, the share of the mass the plan budgets for (module docstring).
        max_avg_bound, max_lse_bound: a-posteriori, from running the fast kernel on the given
            tokens (``kernel_report(x)``, fast path only): the largest per-query bounds.
        fallback_rows: queries whose a-posteriori bound misses ``tol`` (Auto recomputes them
            with the exact kernel; Fast returns them as they are).
    """

    path: str = eqx.field(static=True)
    reason: str = eqx.field(static=True)
    backend: str = eqx.field(static=True)
    plan: GaussianSumPlan | None = None
    predicted_speedup: float | None = eqx.field(static=True, default=None)
    predicted_error: float | None = eqx.field(static=True, default=None)
    mass_ratio: float | None = eqx.field(static=True, default=None)
    max_avg_bound: float | None = eqx.field(static=True, default=None)
    max_lse_bound: float | None = eqx.field(static=True, default=None)
    fallback_rows: int | None = eqx.field(static=True, default=None)

    @property
    def fast(self) -> bool:
        return self.path == "fast"


def _window(beta):
    """A declared β window as a hashable pair of floats (static fields are hashed by jit)."""
    if beta is None:
        return None
    if isinstance(beta, Real) or len(beta) != 2:
        raise ValueError(f"beta must be None or a window (lo, hi), got {beta!r}")
    return (float(beta[0]), float(beta[1]))


class AbstractBackend(eqx.Module):
    """How an attention computes its softmax reductions (a strategy value, all fields static).

    A backend computes: :meth:`lse_average` reduces one :class:`~.reduction.SoftmaxReduction`,
    :meth:`over_heads` maps a function of one head (that reduces with this backend) over the
    heads, :meth:`dot_cost_geometry` gives Sinkhorn its ott-jax geometry. :meth:`choose` and
    :meth:`report` say which kernel it takes for a problem, and why (reporting only: the
    attention never asks).
    """

    @abc.abstractmethod
    def choose(self, *, m: int, n: int, e: int, dtype, causal: bool) -> KernelReport:
        """The kernel for an m-query, n-key reduction with e value columns (static)."""

    def bind(self, owner: str, *, Q, K, beta, gamma_factor=1.0) -> AbstractBackend:
        """This backend as the attention ``owner`` uses it (called when the attention is built):
        scores a = Qx, b = Kx with γ = ``gamma_factor`` · β (see :func:`~.binding.score_box`)."""
        return self

    def check_causal(self, owner: str) -> None:
        """A ValueError naming ``owner`` if this backend cannot compute reductions masked by
        position (called when ``tp.Causal`` wraps the attention); every backend but ``Fast`` can."""

    @abc.abstractmethod
    def lse_average(self, reduction: SoftmaxReduction, *, axis_name=None):
        """``(avg, lse)`` of ``reduction``. With ``axis_name`` (inside ``shard_map``) its keys are
        this device's, and the reduction runs over every device's keys."""

    @abc.abstractmethod
    def over_heads(self, head, *stacked, m: int | None = None, n: int | None = None, e: int = 1,
                   dtype=None, causal: bool = False):
        """``head(*per_head)`` for every head (the leading axis of ``stacked``), stacked; ``m, n,
        e, dtype, causal``: each head's reduction, where the caller knows them."""

    def sum_over_heads(self, a, b, v, bias, gamma, *, dtype, exact_scores=None, causal: bool = False,
                       query_offset=0, axis_name=None):
        """``Σ_h Σ_j softmax_j(γ⟨a_hi, b_hj⟩ + bias_j) v_j`` for heads with their own scores
        ``a`` ``(H, m, k)``, ``b`` ``(H, n, k)`` and one set of values ``v`` ``(n, e)`` and biases
        (multi-head attention whose heads share their value and output maps): one reduction per
        head (:meth:`over_heads`), summed; the exact kernel sums the heads' weights first.
        ``exact_scores``: ``(q, k)`` with ``q_i·k_hj = γ⟨a_hi, b_hj⟩``, ``q`` ``(m, p)`` shared by
        the heads, ``k`` ``(H, n, p)``: a cheaper factorization for the exact kernel."""
        q, k = (None, None) if exact_scores is None else exact_scores

        def head(ah, bh, kh=None):
            red = SoftmaxReduction(ah, bh, v, bias, gamma, dtype, exact_scores=None if kh is None else (q, kh),
                                   causal=causal, query_offset=query_offset)
            return self.lse_average(red, axis_name=axis_name)[0]

        sizes = dict(m=a.shape[1], n=keys_over_devices(b.shape[1], axis_name), e=v.shape[-1],
                     dtype=dtype, causal=causal)
        return jnp.sum(self.over_heads(head, a, b, *(() if k is None else (k,)), **sizes), axis=0)

    def with_token_radius(self, r: float, who: str) -> AbstractBackend:
        """This backend where ``who`` (a wrapper such as ``tp.Sphere``) declares |x| <= ``r``
        for every token and query: a bound backend without a declared bound on |x| takes it."""
        return self

    @abc.abstractmethod
    def dot_cost_geometry(self, a, b, scale, *, epsilon, dtype) -> "ott.geometry.geometry.Geometry":
        """An ott-jax geometry for the cost ``c_ij = -scale ⟨a_i, b_j⟩`` with regularization
        ``epsilon``, whose log-sum-exp kernel this backend computes (Sinkhorn attention)."""

    def report(self, reductions: list[SoftmaxReduction]) -> KernelReport:
        """:meth:`choose` for these reductions (one per head; the same shapes), with the
        a-posteriori bounds of the fast kernel on their data where it is taken."""
        r = reductions[0]
        return self.choose(m=r.num_queries, n=r.num_keys, e=r.value_width, dtype=r.dtype,
                           causal=r.causal)


class Exact(AbstractBackend):
    """The exact kernel (:func:`.exact.lse_average`): any score dimension, causal included (what
    the automatic default takes unless the fast kernel is known to be cheaper and accurate).

    Args:
        layout: how it visits the pairs: :class:`~.exact.DenseOrStreaming` (the default: dense
            up to ``DENSE_MAX_PAIRS`` pairs, exact streaming above), :class:`~.exact.Dense` or
            :class:`~.exact.Streaming` (its key and query blocks).
    """

    layout: AbstractLayout = eqx.field(static=True, default=DEFAULT_LAYOUT)

    def __check_init__(self):
        exact.check_layout(self.layout, "Exact.layout")

    def choose(self, *, m, n, e, dtype, causal):
        return KernelReport(path="exact", reason="Exact backend", backend="Exact")

    def lse_average(self, reduction, *, axis_name=None):
        q, k, v, bias = reduction.exact_form()
        k, v, bias = gather_keys(axis_name, k, v, bias)
        return exact.lse_average(q, k, v, bias, causal=reduction.causal,
                                 query_offset=reduction.query_offset, layout=self.layout)

    def over_heads(self, head, *stacked, m=None, n=None, e=1, dtype=None, causal=False):
        return jax.vmap(head)(*stacked)  # one batched kernel

    def sum_over_heads(self, a, b, v, bias, gamma, *, dtype, exact_scores=None, causal=False, query_offset=0,
                       axis_name=None):
        q, k = (gamma * a, b) if exact_scores is None else exact_scores
        # keys on axis 1 of k: gathered as rows (axis 0), like every key array
        kt, v, bias = gather_keys(axis_name, jnp.moveaxis(k, 1, 0), v, bias)
        return exact.head_sum_average(q, jnp.moveaxis(kt, 0, 1), v, bias, causal=causal,
                                      query_offset=query_offset, layout=self.layout)

    def dot_cost_geometry(self, a, b, scale, *, epsilon, dtype):
        from ott.geometry import costs, geometry  # ott (and scipy.stats) only where Sinkhorn runs

        from .point_clouds import StreamingDotCloud

        blocks = self.layout.blocks(a.shape[0], b.shape[0])
        if blocks is None:
            return geometry.Geometry(cost_matrix=-scale * (a @ b.T), epsilon=epsilon)
        # the same cost, recomputed in blocks of keys: O(n·block), the n x n matrix never formed
        return StreamingDotCloud(scale * a, b, costs.NegDotProduct(), batch_size=blocks[1],
                                 epsilon=epsilon)


# ---------------------------------------------------------------------------------------------
# the Gaussian-sum backends


@functools.lru_cache(maxsize=256)
def _plan(gamma: tuple[float, float], radius: float, k: int, tol: float, dtype: str,
          nthreads: int, max_bytes: float, e: int) -> tuple[GaussianSumPlan, bool]:
    """(plan, reached): ``reached`` is False where ``tol`` is below what ``dtype`` reaches.
    Raises :class:`~.fast.PlanTooLarge` above ``max_bytes`` (before allocating anything)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_gaussian_sum(gamma, radius, k, tol, dtype, nthreads=nthreads,
                                 max_bytes=max_bytes, value_width=e)
    return plan, not caught


def _default_mass_ratio(box: ScoreBox) -> float:
    return 4.0 * (1.0 + box.gamma[1] * box.radius**2)


class _AbstractGaussianBackend(AbstractBackend):
    """Shared by :class:`Fast` and :class:`Auto` (their fields are documented there)."""

    tol: eqx.AbstractVar[float]
    radius: eqx.AbstractVar[float | None]
    score_radius: eqx.AbstractVar[float | None]
    beta: eqx.AbstractVar[tuple[float, float] | None]
    mass_ratio: eqx.AbstractVar[float | None]
    nthreads: eqx.AbstractVar[int]
    max_plan_bytes: eqx.AbstractVar[float]
    platform: eqx.AbstractVar[str | None]
    box: eqx.AbstractVar[ScoreBox | None]

    def _check_fields(self):
        name = type(self).__name__
        if not (isinstance(self.tol, Real) and 0 < self.tol < 1):
            raise ValueError(f"{name}.tol must lie in (0, 1), got {self.tol!r}")
        if self.radius is not None and not (isinstance(self.radius, Real)
                                            and 0 < self.radius < math.inf):
            raise ValueError(f"{name}.radius must be a positive, finite bound on |x|, got "
                             f"{self.radius!r}")
        if self.score_radius is not None and not (isinstance(self.score_radius, Real)
                                                  and 0 < self.score_radius < math.inf):
            raise ValueError(f"{name}.score_radius must be None or positive and finite, got "
                             f"{self.score_radius!r}")
        if not (isinstance(self.max_plan_bytes, Real) and self.max_plan_bytes > 0):
            raise ValueError(f"{name}.max_plan_bytes must be a positive number of bytes, got "
                             f"{self.max_plan_bytes!r}")
        if self.platform is not None and not isinstance(self.platform, str):
            raise ValueError(f"{name}.platform must be None (JAX's default backend) or a platform "
                             f"name such as 'cpu' or 'gpu', got {self.platform!r}")
        if self.beta is not None:
            lo, hi = self.beta
            if not 0 < lo <= hi < math.inf:
                raise ValueError(f"{name}.beta must be a window (lo, hi) with 0 < lo <= hi, got "
                                 f"{self.beta!r}")
        if self.mass_ratio is not None and not self.mass_ratio >= 1:
            raise ValueError(f"{name}.mass_ratio must be None or >= 1, got {self.mass_ratio!r}")

    def bind(self, owner, *, Q, K, beta, gamma_factor=1.0):
        box = score_box(self, owner, Q=Q, K=K, beta=beta, gamma_factor=gamma_factor)
        self._check_box(box, owner)
        return dataclasses.replace(self, box=box)

    def _check_box(self, box: ScoreBox, owner: str):
        """Refuse, when the attention is built, what this backend cannot plan (Fast)."""

    def with_token_radius(self, r, who):
        if self.box is None or self.radius is not None or self.score_radius is not None:
            return self
        return dataclasses.replace(self, box=self.box.with_token_radius(r, who))

    def run_platform(self) -> str:
        """The platform the reductions run on: ``platform``, or JAX's default backend."""
        return self.platform if self.platform is not None else current_platform()

    def runs_here(self) -> bool:
        """Whether the installed jax-finufft has a kernel for :meth:`run_platform`."""
        return self.run_platform() in fast_platforms()

    def _rho(self) -> float:
        return float(self.mass_ratio) if self.mass_ratio is not None else _default_mass_ratio(self.box)

    @abc.abstractmethod
    def _target(self) -> float:
        """The η the plan is asked for."""

    @abc.abstractmethod
    def fast_lse_average(self, plan: GaussianSumPlan, a, b, v, bias, gamma, *, axis_name=None):
        """(avg, lse) of the logits ``gamma a_i·b_j + bias_j`` through the fast kernel with
        ``plan``, checked (:class:`Fast` raises outside the plan, :class:`Auto` recomputes what
        misses ``tol`` exactly)."""

    def plan_for(self, dtype, points: int | None = None, e: int = 1) -> tuple[GaussianSumPlan, bool]:
        """The plan for ``dtype``; ``points`` (queries + keys) picks FINUFFT's threads when
        ``nthreads=0`` (one thread below ``SMALL_PROBLEM`` points, all cores above); ``e`` value
        columns. Raises :class:`~.fast.PlanTooLarge` (naming the sizes, β and the budget) where
        its working memory exceeds ``max_plan_bytes``."""
        box = self.box
        threads = int(self.nthreads)
        if threads == 0 and points is not None and points < SMALL_PROBLEM:
            threads = 1
        try:
            return _plan(tuple(box.gamma), float(box.radius), int(box.k), self._target(),
                         np.dtype(dtype).name, threads, float(self.max_plan_bytes), int(e))
        except PlanTooLarge as err:
            beta = box.beta
            where = "" if beta is None else (f"beta={beta[0]:.6g}" if beta[0] == beta[1] else
                                             f"beta in [{beta[0]:.6g}, {beta[1]:.6g}]")
            raise PlanTooLarge(f"{type(self).__name__}: {where + ': ' if where else ''}{err} "
                               f"[{box.note}]") from None

    def _fast_report(self, plan, m, n, e, reason) -> KernelReport:
        rho = self._rho()
        return KernelReport(path="fast", reason=reason, backend=type(self).__name__, plan=plan,
                            predicted_speedup=plan.predicted_speedup(n, m, e),
                            predicted_error=2.0 * rho * plan.eta, mass_ratio=rho)

    def over_heads(self, head, *stacked, m=None, n=None, e=1, dtype=None, causal=False):
        # one head at a time, not vmap: Auto's fallback is a lax.switch, which vmap would turn
        # into running every branch; where the choice is exact for every head, one batched kernel
        if m is not None and not self.choose(m=m, n=n, e=e, dtype=dtype, causal=causal).fast:
            return jax.vmap(head)(*stacked)
        outs = [head(*(z[h] for z in stacked)) for h in range(stacked[0].shape[0])]
        return jax.tree.map(lambda *zs: jnp.stack(zs), *outs)

    def _fast_geometry(self, plan, a, b, scale, epsilon, dtype, layout):
        # c_ij = -scale <a_i, b_j>: each Sinkhorn half-iteration a Gaussian sum of bandwidth
        # scale/eps; ott's applications to a vector run on the exact kernel (``layout``'s blocks)
        from .point_clouds import FastDotCloud  # ott only where Sinkhorn runs

        blocks = layout.blocks(a.shape[0], b.shape[0])
        return FastDotCloud(a.astype(dtype), b.astype(dtype), jnp.asarray(scale).astype(dtype),
                            backend=self, plan=plan, batch_size=blocks[1] if blocks else None,
                            epsilon=epsilon)

    def report(self, reductions):
        report = super().report(reductions)
        if not report.fast:
            return report
        plan, tol = report.plan, float(self.tol)
        avg_b = lse_b = 0.0
        bad = np.zeros(reductions[0].num_queries, bool)
        for r in reductions:
            info = _sum_info(r, plan)
            ab, lb = np.asarray(info.avg_bound), np.asarray(info.lse_bound)
            avg_b, lse_b = max(avg_b, float(ab.max())), max(lse_b, float(lb.max()))
            scale = max(1.0, float(info.value_half_range))
            bad |= ~np.asarray(info.in_box) | (lb > tol) | (ab > tol * scale)
        return dataclasses.replace(report, max_avg_bound=avg_b, max_lse_bound=lse_b,
                                   fallback_rows=int(bad.sum()))


@eqx.filter_jit
def _sum_info(reduction: SoftmaxReduction, plan):
    return fast_lse_average_with_info(*reduction.gaussian_form(), plan, throw=False)[2]


class Fast(_AbstractGaussianBackend):
    r"""The NUFFT Gaussian sum (:mod:`.fast`), forced: O(n + M log M) instead of O(n m k).

    Needs a score space of dimension k <= 3 (Q, K of shape (k, d)) and a non-causal attention
    (checked when the attention is built). The plan has η = ``tol``: every kernel sum is within
    ``tol`` of the total mass, so a query's average is within 2Vρ_i·tol and its log-normalizer
    within about ρ_i·tol (module docstring; ``attn.kernel_report(x)`` gives the per-query bounds).
    No fallback: where that is not enough, use :class:`Auto`.

    Args:
        tol: the plan's η (relative to the total mass).
        radius: bound on |x|_2 of every token and query over the run (1: unit tokens, the sphere).
        score_radius: bound R on |Qx|_∞, |Kx|_∞ directly (overrides ``radius``; needed when Q or
            K is a callable or traced when the attention is built).
        beta: window (lo, hi) of β when β is traced when the attention is built or moves during
            a fit; None: the concrete β.
        mass_ratio: ρ⋆ for the report's predicted error (default 4(1 + γR²)).
        nthreads: FINUFFT threads (0: all cores).
        max_plan_bytes: the plan's working-memory budget in bytes (default
            ``PLAN_MEMORY_BUDGET``, 1 GiB): a larger plan (modes grow like R√γ per dimension) is
            refused with :class:`~.fast.PlanTooLarge`, a ValueError naming the sizes, β and the
            budget, when the attention is built and on every call.
        platform: the JAX platform it runs on (None: ``jax.default_backend()``); one the
            installed jax-finufft has no kernel for (:func:`~.platforms.fast_platforms`) raises,
            naming what to install.
        box: filled in by the attention (:class:`ScoreBox`); do not pass it.

    A token outside the planned box, or β outside the window, raises (``eqx.error_if``).
    """

    tol: float = eqx.field(static=True, default=1e-8)
    radius: float = eqx.field(static=True, default=1.0)
    score_radius: float | None = eqx.field(static=True, default=None)
    beta: tuple[float, float] | None = eqx.field(static=True, default=None, converter=_window)
    mass_ratio: float | None = eqx.field(static=True, default=None)
    nthreads: int = eqx.field(static=True, default=0)
    max_plan_bytes: float = eqx.field(static=True, default=PLAN_MEMORY_BUDGET)
    platform: str | None = eqx.field(static=True, default=None)
    box: ScoreBox | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        self._check_fields()

    def _target(self):
        return float(self.tol)

    def _check_platform(self):
        platform = self.run_platform()
        if platform not in fast_platforms():
            raise RuntimeError(f"Fast: {no_fast_path_message(platform)}")

    def plan_for(self, dtype, points=None, e=1):
        self._check_platform()
        return super().plan_for(dtype, points, e)

    def check_causal(self, owner):
        raise ValueError(f"{owner}: backend=Fast needs a non-causal attention (a causal mask is "
                         "not a convolution); use Exact, or Auto (which takes the exact kernel)")

    def _check_box(self, box, owner):
        if box.k > _MAX_K:
            raise ValueError(f"{owner}: backend=Fast needs scores in R^k with k <= 3 (Q, K of shape "
                             f"(k, d)), got k={box.k}; use Exact, or Auto")
        if not box.known:
            raise ValueError(f"{owner}: backend=Fast cannot be planned before tracing: {box.note}")
        self._check_platform()
        # the plan's size, before anything runs (one value column: the least it needs)
        dataclasses.replace(self, box=box).plan_for(jnp.result_type(float))

    def choose(self, *, m, n, e, dtype, causal):
        plan, reached = self.plan_for(dtype, m + n, e)
        reason = "Fast backend (forced)"
        if not reached:
            reason += (f"; tol={self.tol:g} is below what {np.dtype(dtype).name} reaches, "
                       f"achieved eta={plan.eta:.2g}")
        return self._fast_report(plan, m, n, e, reason)

    def lse_average(self, reduction, *, axis_name=None):
        if reduction.causal:
            raise ValueError("Fast: a causal mask is not a convolution; use Exact or Auto")
        m, n = reduction.num_queries, keys_over_devices(reduction.num_keys, axis_name)
        plan, _ = self.plan_for(reduction.dtype, m + n, reduction.value_width)
        return self.fast_lse_average(plan, *reduction.gaussian_form(), axis_name=axis_name)

    def dot_cost_geometry(self, a, b, scale, *, epsilon, dtype):
        plan, _ = self.plan_for(dtype, a.shape[0] + b.shape[0])
        return self._fast_geometry(plan, a, b, scale, epsilon, dtype, DEFAULT_LAYOUT)

    @eqx.filter_jit
    def fast_lse_average(self, plan, a, b, v, bias, gamma, *, axis_name=None):
        """A token outside the box or γ outside the window raises (compiled once per plan and
        shapes, ``eqx.filter_jit``, so eager calls are not op by op)."""
        avg, lse, info, in_window = _fast_sum(plan, a, b, v, bias, gamma, axis_name)
        avg = runtime_check(avg, ~info.in_box, _box_message(self, plan))
        avg = runtime_check(avg, ~in_window, _window_message(self, plan))
        return avg, lse


class Auto(_AbstractGaussianBackend):
    r"""The fast kernel where it is predicted cheaper and accurate, the exact one otherwise.

    The choice is static (shapes, dtype, the plan) and inspectable (``attn.kernel_report(x)``):
    exact for a causal attention, for k > 3, where no box or γ window is known before tracing,
    where ``tol`` is below what the dtype reaches, or where the predicted flop ratio is below
    ``min_speedup``; fast otherwise. On the fast path every query whose a-posteriori bound misses
    ``tol`` (outside the box or the β window included) is recomputed with the exact kernel, so the
    returned averages are within ``tol·max(1, V)`` and the log-normalizers within ``tol`` of the
    exact ones (module docstring).

    Also exact where the plan's working memory exceeds ``max_plan_bytes``, and on a platform the
    installed jax-finufft does not serve (:func:`~.platforms.fast_platforms`; PyPI's wheels are
    CPU-only).

    Args:
        tol: the target error per query (see above).
        radius: bound on |x|_2 of every token and query over the run (default 1); None: no bound
            declared, so exact unless a wrapper declares one (``tp.Sphere`` does: this is the
            default backend of every attention, :func:`automatic`).
        score_radius, beta, nthreads, max_plan_bytes, platform: as in :class:`Fast`.
        mass_ratio: ρ⋆, the share of the mass the plan budgets for (η = tol / (2ρ⋆); default
            4(1 + γR²)); queries with ρ_i beyond it are likely to be recomputed exactly.
        min_speedup: least predicted flop ratio for the fast path (None: ``MIN_SPEEDUP`` of the
            dtype, 1 in float64 and 4 in float32).
        exact: the exact kernel it takes, or falls back to (an :class:`Exact` backend: its
            layout).
        box: filled in by the attention; do not pass it.
    """

    tol: float = eqx.field(static=True, default=1e-8)
    radius: float | None = eqx.field(static=True, default=1.0)
    score_radius: float | None = eqx.field(static=True, default=None)
    beta: tuple[float, float] | None = eqx.field(static=True, default=None, converter=_window)
    mass_ratio: float | None = eqx.field(static=True, default=None)
    min_speedup: float | None = eqx.field(static=True, default=None)
    nthreads: int = eqx.field(static=True, default=0)
    max_plan_bytes: float = eqx.field(static=True, default=PLAN_MEMORY_BUDGET)
    platform: str | None = eqx.field(static=True, default=None)
    exact: Exact = eqx.field(static=True, default=Exact())
    box: ScoreBox | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        self._check_fields()
        if not isinstance(self.exact, Exact):
            raise ValueError(f"Auto.exact must be an Exact backend, got {self.exact!r}")

    def _target(self):
        return float(self.tol) / (2.0 * self._rho())

    def choose(self, *, m, n, e, dtype, causal):
        def exact_because(why, plan=None, **kw):
            return KernelReport(path="exact", reason=why, backend="Auto", plan=plan, **kw)

        if causal:
            return exact_because("causal attention: a causal mask is not a convolution")
        box = self.box
        if box is None:
            return exact_because("no score box (the backend was not bound to an attention)")
        if box.k > _MAX_K:
            return exact_because(f"scores in R^{box.k}: the fast kernel needs k <= 3")
        if not box.known:
            return exact_because(f"no plan before tracing: {box.note}")
        if not self.runs_here():
            return exact_because(no_fast_path_message(self.run_platform()))
        try:
            plan, reached = self.plan_for(dtype, m + n, e)
        except PlanTooLarge as err:
            return exact_because(f"plan over budget: {err}")
        rho = self._rho()
        kw = dict(predicted_speedup=plan.predicted_speedup(n, m, e),
                  predicted_error=2.0 * rho * plan.eta, mass_ratio=rho)
        if not reached:
            return exact_because(f"tol={self.tol:g} is out of reach in {np.dtype(dtype).name}: the "
                                 f"plan's bound is {2 * rho * plan.eta:.2g} at rho={rho:.3g}", **kw)
        least = self.min_speedup
        if least is None:
            least = MIN_SPEEDUP.get(np.dtype(dtype).name, max(MIN_SPEEDUP.values()))
        if kw["predicted_speedup"] < least:
            return exact_because(f"predicted {kw['predicted_speedup']:.3g}x fewer flops, below "
                                 f"min_speedup={least:g} (n={n}, m={m})", **kw)
        return self._fast_report(plan, m, n, e, (
            f"predicted {kw['predicted_speedup']:.3g}x fewer flops, a-priori error "
            f"{kw['predicted_error']:.2g} <= tol={self.tol:g} for queries with rho <= {rho:.3g}; "
            "others recomputed exactly"))

    def lse_average(self, reduction, *, axis_name=None):
        choice = self.choose(m=reduction.num_queries,
                             n=keys_over_devices(reduction.num_keys, axis_name),
                             e=reduction.value_width, dtype=reduction.dtype, causal=reduction.causal)
        if not choice.fast:
            return self.exact.lse_average(reduction, axis_name=axis_name)
        return self.fast_lse_average(choice.plan, *reduction.gaussian_form(), axis_name=axis_name)

    def sum_over_heads(self, a, b, v, bias, gamma, *, dtype, exact_scores=None, causal=False, query_offset=0,
                       axis_name=None):
        choice = self.choose(m=a.shape[1], n=keys_over_devices(b.shape[1], axis_name), e=v.shape[-1],
                             dtype=dtype, causal=causal)
        backend = self.exact if not choice.fast else super()
        return backend.sum_over_heads(a, b, v, bias, gamma, dtype=dtype, exact_scores=exact_scores,
                                      causal=causal, query_offset=query_offset, axis_name=axis_name)

    def dot_cost_geometry(self, a, b, scale, *, epsilon, dtype):
        # ott's kernel applications average one column (its potentials)
        choice = self.choose(m=a.shape[0], n=b.shape[0], e=1, dtype=dtype, causal=False)
        if not choice.fast:
            return self.exact.dot_cost_geometry(a, b, scale, epsilon=epsilon, dtype=dtype)
        return self._fast_geometry(choice.plan, a, b, scale, epsilon, dtype, self.exact.layout)

    @eqx.filter_jit
    def fast_lse_average(self, plan, a, b, v, bias, gamma, *, axis_name=None):
        """Every query whose a-posteriori bound misses ``tol`` is recomputed exactly (module
        docstring); with ``axis_name`` the decision is taken jointly by all devices (the exact
        branches gather keys)."""
        avg, lse, info, in_window = _fast_sum(plan, a, b, v, bias, gamma, axis_name)
        gamma = jnp.asarray(gamma, jnp.result_type(a))
        tol = float(self.tol)
        ok = (info.in_box & in_window & (info.lse_bound <= tol)
              & (info.avg_bound <= tol * jnp.maximum(1.0, info.value_half_range)))
        m = a.shape[0]
        cap = min(m, PATCH_ROWS)
        nbad = jnp.sum(~ok)
        branch = jnp.where(nbad == 0, 0, jnp.where(nbad <= cap, 1, 2)).astype(jnp.int32)
        if axis_name is not None:
            branch = jax.lax.pmax(branch, axis_name)
        exact_sum = functools.partial(_exact_rows, layout=self.exact.layout, axis_name=axis_name)

        def keep(avg, lse):
            return avg, lse

        def patch(avg, lse):
            rows = jnp.nonzero(~ok, size=cap, fill_value=m)[0]  # m: out of range, dropped below
            q = gamma * a.at[rows].get(mode="fill", fill_value=0.0)
            ex_avg, ex_lse = exact_sum(q, b, v, bias)
            return (avg.at[rows].set(ex_avg.astype(avg.dtype), mode="drop"),
                    lse.at[rows].set(ex_lse.astype(lse.dtype), mode="drop"))

        def redo(avg, lse):
            ex_avg, ex_lse = exact_sum(gamma * a, b, v, bias)
            return ex_avg.astype(avg.dtype), ex_lse.astype(lse.dtype)

        return jax.lax.switch(branch, [keep, patch, redo], avg, lse)


def automatic() -> Auto:
    """The backend of an attention given none: ``Auto(radius=None)``. Exact unless the tokens'
    bound is known (``tp.Sphere`` declares it; no bound is assumed in R^d), the score dimension
    is <= 3, the attention is non-causal, β (or its window) is concrete when built, the dtype
    reaches ``tol`` = 1e-8 (float64), jax-finufft runs on the platform, the plan fits its memory
    budget and its predicted flop ratio reaches ``MIN_SPEEDUP`` (in float64 on S², n >= 4096);
    fast, with the exact fallback, otherwise. The choice is static (shapes, dtype, the plan):
    small and vmapped systems run exactly what ``Exact()`` runs."""
    return Auto(radius=None)


def bind_backend(backend, owner: str, *, Q, K, beta, gamma_factor=1.0) -> AbstractBackend:
    """The attention ``owner``'s backend, bound to it (:meth:`AbstractBackend.bind`; ``None`` is
    :func:`automatic`, ``Auto(radius=None)``)."""
    if backend is None:
        backend = automatic()
    if not isinstance(backend, AbstractBackend):
        raise ValueError(f"{owner}.backend must be a kernel backend such as tp.kernels.Exact(), "
                         f"tp.kernels.Fast(tol=1e-8) or tp.kernels.Auto(), got {backend!r}")
    return backend.bind(owner, Q=Q, K=K, beta=beta, gamma_factor=gamma_factor)


# ---------------------------------------------------------------------------------------------
# the fast reduction, and its messages


def _exact_rows(q, b, v, bias, *, layout, axis_name):
    b, v, bias = gather_keys(axis_name, b, v, bias)
    return exact.lse_average(q, b, v, bias, layout=layout)


def _in_window(gamma, plan):
    return (gamma >= plan.gamma_min * (1 - 1e-9)) & (gamma <= plan.gamma_max * (1 + 1e-9))


def _fast_sum(plan, a, b, v, bias, gamma, axis_name):
    """The fast kernel's (avg, lse, info) and whether γ lies in the plan's window; outside it the
    kernel runs at the nearest planned γ (its own check never fires): Fast raises, Auto
    recomputes every row exactly."""
    gamma = jnp.asarray(gamma, jnp.result_type(a))
    in_window = _in_window(gamma, plan)
    g_run = jnp.where(in_window, gamma, jnp.clip(gamma, plan.gamma_min, plan.gamma_max))
    avg, lse, info = fast_lse_average_with_info(a, b, v, bias, g_run, plan, throw=False,
                                                axis_name=axis_name)
    return avg, lse, info, in_window


def _box_message(backend, plan) -> str:
    box = backend.box
    return (f"{type(backend).__name__}: a token left the box the fast kernel was planned for: "
            f"|Qx|_inf or |Kx|_inf > R = {plan.radius:.6g} ({box.note}). Declare a larger "
            f"{type(backend).__name__}(radius=...) (a bound on |x| over the whole run) or "
            "score_radius=, or use tp.kernels.Auto, which falls back to the exact kernel")


def _window_message(backend, plan) -> str:
    return (f"{type(backend).__name__}: gamma left the window [{plan.gamma_min:.6g}, "
            f"{plan.gamma_max:.6g}] the fast kernel was planned for ({backend.box.note}); "
            f"declare {type(backend).__name__}(beta=(lo, hi)) covering every beta of the run")
