r"""Stationary zonal densities on S^{d−1} by Newton continuation in K, their zonal stability, and
the fold K_c(β, d) of the discontinuous transition (docs: math/noise.md#stationary-branches-on-the-sphere).

The stationary Fokker–Planck equation of :mod:`transformer_pde.solvers.zonal` with the value
matrix scaled by K is solved in its self-consistent form (sphere.md §14)

    ρ = exp((2K/σ²)Ψ₁[ρ]) / E[exp((2K/σ²)Ψ₁[ρ])],

(Ψ₁ the potential of ``tp.Sphere(attention)`` with its own V) for the coefficients a_1..a_L of ρ
(a_0 = 1), by the shared pseudo-arclength continuation (:mod:`.continuation`) from the uniform law
at its first instability (l = 1, the pitchfork at K_#). Each point gets the spectrum of the
linearized Fokker–Planck operator on zonal perturbations (l = 1..L): zonal stability only (for
d = 3 the full spectrum on S² has the non-zonal modes too; a rotation of a clustered state is one
of them, with eigenvalue 0). Folds are refined by minimizing K along the branch parametrized by
a_1 (regular at a fold in K), each K(a_1) a Newton solve.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._checks import check_int, check_scalar
from ..models.attention.softmax import SoftmaxAttention
from ..models.attention.unnormalized import UnnormalizedAttention
from ..models.sphere import Sphere
from ..solvers.circle import UnderResolvedError
from ..solvers.zonal import MAX_DEGREE, ZonalDensity, _potential, _tables, _zonal_attention, transport
from .continuation import check_controls, first_instability, jacobian, pseudo_arclength, turning_points


class ZonalBranch(eqx.Module):
    """A branch of stationary zonal densities on S^{d−1}.

    Attributes:
        K: the coupling at each point ``(P,)``; coeffs ``(P, L+1)`` (a_0 = 1).
        order: ⟨cos ϑ⟩ = ∫u ρ = a_1/√d ``(P,)``.
        growth: the largest real part of the zonal spectrum ``(P,)``; stable: growth < 0.
        bifurcation: the K where the branch leaves the uniform law (K_#).
        folds: the K of the turning points, refined (Newton on a_1-sections, Brent on K(a_1));
            fold_orders: ⟨cos ϑ⟩ there.
        stop: why the continuation stopped ("K range", "resolution", "max_points").
    """

    K: np.ndarray
    coeffs: np.ndarray
    order: np.ndarray
    growth: np.ndarray
    stable: np.ndarray
    bifurcation: float
    folds: tuple
    fold_orders: tuple
    d: int = eqx.field(static=True)
    degree: int = eqx.field(static=True)
    stop: str = eqx.field(static=True)


class Fold(eqx.Module):
    """:func:`critical_coupling`'s answer: the fold K_c, the order parameter ⟨cos ϑ⟩ there, the
    bifurcation K_# and the hysteresis width K_# − K_c, with the branch."""

    K_c: float
    order: float
    K_sharp: float
    width: float
    branch: ZonalBranch


def _self_consistency(dynamics, d, u, sigma):
    """a_l − E[φ_l e^{(2K/σ²)Ψ₁}]/E[e^{(2K/σ²)Ψ₁}], l = 1..L, at u = (a_1..a_L, K)."""
    a = jnp.concatenate([jnp.ones(1, u.dtype), u[:-1]])
    _, phi, w = _tables(a.shape[0] - 1, d)
    phi, w = jnp.asarray(phi, u.dtype), jnp.asarray(w, u.dtype)
    psi, _ = _potential(dynamics, a, d)
    e = 2 * u[-1] / sigma**2 * psi
    p = w * jnp.exp(e - jnp.max(e))
    return u[:-1] - (phi.T @ p)[1:] / jnp.sum(p)


def _zonal_jacobian(dynamics, d, sigma, a, K):
    """∂/∂a of K·transport + (σ²/2)Δ on l = 1..L at the coefficients ``a`` (a_0 = 1)."""
    lam = -jnp.arange(a.shape[0]) * (jnp.arange(a.shape[0]) + d - 2)

    def f(x):
        full = jnp.concatenate([a[:1], x])
        return (K * transport(dynamics, full, d) + sigma**2 / 2 * lam * full)[1:]

    return jax.jacfwd(f)(a[1:])


_zonal_jacobian_jit = eqx.filter_jit(_zonal_jacobian)


def zonal_spectrum(dynamics, density, K):
    """Eigenvalues of the linearized ∂_tρ = K·(−div(ρ∇Ψ₁[ρ])) + (σ²/2)Δρ at ``density`` on zonal
    mean-zero perturbations (l = 1..L), sorted by decreasing real part."""
    if not isinstance(density, ZonalDensity):
        raise ValueError(f"density must be a tp.ZonalDensity, got {type(density).__name__}")
    check_scalar(K, "K")
    _zonal_attention(dynamics, density.d)
    return _spectrum(dynamics, density.d, float(density.sigma), np.asarray(density.coeffs), K)


def _spectrum(dynamics, d, sigma, a, K):
    J = np.asarray(_zonal_jacobian_jit(dynamics, d, sigma, jnp.asarray(a), jnp.asarray(K, jnp.float64)))
    lam = np.linalg.eigvals(J)
    return lam[np.argsort(-lam.real)]


@eqx.filter_jit
def _section(dynamics, d, sigma, w0, a1, tol):
    """Newton for (a_2..a_L, K) with a_1 fixed: the branch as a function of a_1."""
    def fn(w, args):
        return _self_consistency(dynamics, d, jnp.concatenate([a1[None], w]), sigma)

    sol = optx.root_find(fn, optx.Newton(rtol=tol, atol=tol), w0, throw=False, max_steps=50)
    return sol.value, sol.result == optx.RESULTS.successful


def _refine_fold(dynamics, d, sigma, U, K0, x0, tol):
    """(K_c, a_1) at the fold: min over a_1 of K(a_1) (Brent), starting from the parabola's vertex."""
    from scipy import optimize

    j = int(np.argmin(np.abs(U[:, 0] - x0)))
    w0 = jnp.asarray(U[j, 1:])
    h = max(abs(U[min(j + 1, len(U) - 1), 0] - U[max(j - 1, 0), 0]), 1e-4)
    cache = {}

    def K_of(x):
        w, ok = _section(dynamics, d, sigma, w0, jnp.asarray(x, jnp.float64), tol)
        if not bool(ok):
            return np.inf
        cache[x] = float(w[-1])
        return float(w[-1])

    res = optimize.minimize_scalar(K_of, bracket=(x0 - h, x0, x0 + h), tol=1e-10)
    if not (res.success and np.isfinite(res.fun)):
        return K0, x0  # the parabola's vertex (the refinement did not converge)
    return float(res.fun), float(res.x)


def _dimension(dynamics) -> int:
    """d of ``tp.Sphere(attention)`` on S^{d−1}, the dynamics checked (ValueError naming what does not fit)."""
    if not (isinstance(dynamics, Sphere) and isinstance(dynamics.dynamics, (SoftmaxAttention, UnnormalizedAttention))):
        _zonal_attention(dynamics, 0)  # raises, naming the type
    d = dynamics.dynamics.dim
    if d < 2:
        raise ValueError(f"the sphere S^{{d-1}} needs d >= 2, got d = {d}")
    _zonal_attention(dynamics, d)
    return d


def zonal_branch(dynamics, sigma, *, degree: int = 32, K_max: float | None = None, K_min: float = 0.0,
                 ds: float = 0.05, ds_min: float = 1e-6, ds_max: float = 0.2, max_points: int = 400,
                 order_max: float = 0.98, tol: float = 1e-11) -> ZonalBranch:
    """The branch of stationary zonal densities that leaves the uniform law at its first
    instability (l = 1, K_#), followed in K (the value matrix K·V) by pseudo-arclength continuation.

    Args:
        dynamics: ``tp.Sphere(attention)`` on S^{d−1} (d the matrices' size, d >= 2) with Q, K, V
            multiples of I (SA or USA); V sets the unit of K.
        sigma: the noise σ > 0.
        degree: the polynomial degree L of the densities (2 <= L <= MAX_DEGREE).
        K_max, K_min: stop when the branch leaves [K_min, K_max] (K_max default: 1.5× the bifurcation).
        ds, ds_min, ds_max: arclength steps (0 < ds_min <= ds <= ds_max); a corrector failing below
            ds_min is :class:`~transformer_pde.stationary.ContinuationError`.
        max_points: stop after this many points (>= 2).
        order_max: in (0, 1]; stop once ⟨cos ϑ⟩ exceeds it; the last coefficient is watched too
            (|a_L| > 1e-8 stops the branch: "resolution").
        tol: the Newton tolerance (absolute, on the coefficients), > 0.
    """
    check_scalar(sigma, "sigma", positive=True)
    check_int(degree, "degree", minimum=2, maximum=MAX_DEGREE)
    if K_max is not None:
        check_scalar(K_max, "K_max", positive=True)
    check_scalar(K_min, "K_min")
    if K_max is not None and not K_min < K_max:
        raise ValueError(f"K_min must be < K_max, got K_min={K_min}, K_max={K_max}")
    check_controls(ds=ds, ds_min=ds_min, ds_max=ds_max, tol=tol, max_points=max_points, order_max=order_max)
    d = _dimension(dynamics)
    if jnp.result_type(float) != jnp.float64:
        raise ValueError(f"zonal_branch needs float64 (Newton to tol={tol:g}): enable jax_enable_x64")
    L = degree
    residual = eqx.Partial(_self_consistency, dynamics, d, sigma=float(sigma))
    u0 = np.concatenate([np.zeros(L), [0.0]])
    J0 = np.asarray(jacobian(residual, jnp.asarray(u0)))[:, :-1]
    J1 = np.asarray(jacobian(residual, jnp.asarray(np.concatenate([np.zeros(L), [1.0]]))))[:, :-1]
    Kb, v = first_instability(J0, J1 - J0)
    K_hi = 1.5 * Kb if K_max is None else K_max
    sq = np.sqrt(d)

    def why(p):
        if not K_min <= p[-1] <= K_hi:
            return "K range"
        return "resolution" if p[0] / sq > order_max or abs(p[L - 1]) > 1e-8 else None

    U, tangents, stop = pseudo_arclength(
        residual, np.concatenate([np.zeros(L), [Kb]]), np.concatenate([v, [0.0]]), ds=ds, ds_min=ds_min,
        ds_max=ds_max, max_points=max_points, tol=tol, stop=why,
        describe=lambda p: f"K = {p[-1]:.6g} (order <cos theta> = {p[0] / sq:.4g}, d = {d}, degree {L})")
    coeffs = np.concatenate([np.ones((len(U), 1)), U[:, :-1]], 1)
    growth = np.array([_spectrum(dynamics, d, float(sigma), c, K)[0].real for c, K in zip(coeffs, U[:, -1])])
    refined = [_refine_fold(dynamics, d, float(sigma), U, K0, x0, tol) for K0, x0 in turning_points(U, tangents)]
    return ZonalBranch(K=U[:, -1], coeffs=coeffs, order=coeffs[:, 1] / sq, growth=growth, stable=growth < -1e-9,
                       bifurcation=Kb, folds=tuple(k for k, _ in refined),
                       fold_orders=tuple(float(x / sq) for _, x in refined), d=d, degree=L, stop=stop)


def critical_coupling(dynamics, sigma, *, degree: int = 32, **kwargs) -> Fold:
    """The fold K_c of the branch of :func:`zonal_branch` (the clustered state's lowest K), the
    order parameter there and the hysteresis width K_# − K_c.

    ValueError if the branch has no fold: the transition is continuous (β <= β_*: the branch
    leaves K_# forwards), or — :class:`~transformer_pde.solvers.UnderResolvedError` — ``degree`` is
    too few for β: the density outgrew it before the branch turned, or the continuation stopped
    first (``max_points`` × ``ds_max`` is the arclength it may cover, and the path to the fold in
    the coefficients is long for large d and β: d = 8, β = 6 needs ``ds_max=1.0``).
    """
    b = zonal_branch(dynamics, sigma, degree=degree, **kwargs)
    if not b.folds:
        beta = float(dynamics.dynamics.beta)
        if len(b.K) > 1 and b.K[1] > b.bifurcation:
            raise ValueError(f"critical_coupling: the branch at beta = {beta:g} on S^{b.d - 1} leaves K_# = "
                             f"{b.bifurcation:.6g} forwards: no fold, the transition is continuous (beta <= beta_*)")
        if b.stop == "resolution":
            raise UnderResolvedError(
                f"critical_coupling: degree {degree} is too few for beta = {beta:g} on S^{b.d - 1}: the density "
                f"outgrew it (|a_L| > 1e-8 or order {b.order[-1]:.3g}) at K = {b.K[-1]:.6g} before the branch "
                "turned; use a higher degree")
        raise ValueError(f"critical_coupling: the branch at beta = {beta:g} on S^{b.d - 1} leaves K_# = "
                         f"{b.bifurcation:.6g} backwards and does not turn before it stops ({b.stop}): raise max_points "
                         "or ds_max (the arclength to the fold, in the coefficients, grows with d and beta), or lower "
                         "K_min")
    return Fold(K_c=b.folds[0], order=b.fold_orders[0], K_sharp=b.bifurcation, width=b.bifurcation - b.folds[0],
                branch=b)


__all__ = ["Fold", "ZonalBranch", "critical_coupling", "zonal_branch", "zonal_spectrum"]
