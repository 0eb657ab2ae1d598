r"""Stationary densities on S¹ by Newton continuation, with their linear stability
(docs: math/noise.md#stationary-branches).

The stationary Fokker–Planck equation of :mod:`transformer_pde.solvers.circle` with the value matrix scaled by K,

    F(ρ, K) = −K ∂_θ(ρ v₁[ρ]) + (σ²/2)∂²_θρ = 0,   ∫ρ dθ/2π = 1,

(v₁ the field of ``tp.Sphere(attention)`` with its own V; stationary states depend on K/σ² only,
so a branch in K is also one in σ) is solved for reflection-symmetric densities
ρ = 1 + Σ_{k<M} a_k cos kθ (this removes the rotation symmetry; needs A, V multiples of I).
:func:`branch_from_uniform` finds the first K at which the uniform law loses stability from the
Jacobian of F at the uniform law (a generalized eigenvalue problem, not the theory's formula),
switches to the bifurcating branch along the null vector and follows it by pseudo-arclength
continuation, each corrector an ``optimistix.Newton`` root find; a corrector that fails at the
smallest step is :class:`ContinuationError` (the branch is lost, not guessed). Each point gets the
spectrum of the linearization on all mean-zero perturbations (cosines and sines) in the Fourier
basis; the zero eigenvalue of rotations is removed for non-uniform states. Folds are the points
where dK/ds changes sign: for β > β_* the branch leaves K_# backwards and turns at K_c < K_#.

S² (s2fft): not done here. s2fft is not a dependency of the project (not in its environment);
it is on PyPI (1.5.0, a JAX library of spherical-harmonic transforms) and could be added. On S² the
interaction e^{β⟨x,y⟩} is zonal, so by Funk–Hecke the convolution is diagonal in degree l (factor
c_l(β)) and the Laplacian is −l(l+1): with s2fft's forward/inverse transforms the same
pseudo-spectral, IMEX and continuation machinery carries over (the rotation group then leaves a
2-dimensional null space to factor out, e.g. by restricting to zonal densities).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_int, check_scalar, is_concrete
from ..solvers.circle import CircleDensity, _circle_attention, grid
from .continuation import ContinuationError, check_controls, first_instability, folds, pseudo_arclength


class Branch(eqx.Module):
    """A branch of stationary densities.

    Attributes:
        K: the coupling at each point ``(P,)``; densities ``(P, N)`` on the grid of ``modes``
            (a truncated cosine series: where the density is near 0 it may dip below 0 by its
            truncation error, bounded by the resolution stop).
        order: m = |∫e^{iθ}ρ dθ/2π| ``(P,)``.
        growth: the largest real part of the linearization's spectrum at each point (rotations
            removed) ``(P,)``; stable: growth < 0.
        bifurcation: the K at which the branch leaves the uniform law.
        folds: the K of the turning points (dK/ds = 0), in order along the branch.
        stop: why the continuation stopped.
    """

    K: np.ndarray
    densities: np.ndarray
    order: np.ndarray
    growth: np.ndarray
    stable: np.ndarray
    bifurcation: float
    folds: tuple
    modes: int = eqx.field(static=True)
    stop: str = eqx.field(static=True)


def _full(a, n):
    """Grid values of 1 + Σ_k a_k cos kθ (k = 1..len(a)) on n points."""
    c = jnp.zeros(n // 2 + 1, a.dtype).at[0].set(n).at[1:a.shape[0] + 1].set(a * n / 2)
    return jnp.fft.irfft(c.astype(jnp.result_type(a.dtype, jnp.complex64)), n)


def _cos_coeffs(f, m):
    """a_k, k = 1..m, of f = Σ a_k cos kθ + ... on its grid."""
    n = f.shape[0]
    return 2 * jnp.real(jnp.fft.rfft(f))[1:m + 1] / n


@eqx.filter_jit
def _residual(dynamics, density, a, K):
    rho = _full(a, density.values.shape[0])
    rhs = K * density.transport(dynamics, rho) + density.diffusion(rho)
    return _cos_coeffs(rhs, a.shape[0])


def _parts(dynamics, density, a):
    """(∂R/∂a at K = 0, ∂R/∂a of the transport): R is affine in K."""
    jt = jax.jacfwd(lambda x: _residual(dynamics, density, x, 1.0) - _residual(dynamics, density, x, 0.0))(a)
    jd = jax.jacfwd(lambda x: _residual(dynamics, density, x, 0.0))(a)
    return np.asarray(jd), np.asarray(jt)


def _residual_u(dynamics, density, u):
    """R at u = (a, K), for the shared continuation."""
    return _residual(dynamics, density, u[:-1], u[-1])


@eqx.filter_jit
def _full_jacobian(dynamics, density, rho, K):
    return jax.jacfwd(lambda r: K * density.transport(dynamics, r) + density.diffusion(r))(rho)


def spectrum(dynamics, density: CircleDensity, K, drop_rotation: bool = True):
    """Eigenvalues of the linearization of ρ ↦ −K∂_θ(ρv₁[ρ]) + (σ²/2)∂²_θρ at ``density`` on
    mean-zero perturbations (cos kθ, sin kθ, 1 <= k < N/2), sorted by decreasing real part; with
    ``drop_rotation`` the eigenvalue nearest 0 (ρ', the rotation of a non-uniform state) is removed."""
    if not isinstance(density, CircleDensity):
        raise ValueError(f"density must be a tp.CircleDensity, got {type(density).__name__}")
    check_scalar(K, "K")
    return _spectrum(dynamics, density, density.values, K, drop_rotation)


def _spectrum(dynamics, operator: CircleDensity, rho, K, drop_rotation: bool):
    """:func:`spectrum` at the grid values ``rho`` (mean 1), the operator's σ from ``operator``.
    A point of a branch is a truncated cosine series: where the density is near 0 its grid values
    carry truncation error and round-off of either sign (down to -5e-9 before the resolution stop),
    which :class:`CircleDensity` rightly refuses as input, so the branch's points are not made
    densities."""
    n = rho.shape[0]
    th = np.asarray(grid(n // 2))
    ks = np.arange(1, n // 2)
    B = np.concatenate([np.cos(np.outer(th, ks)), np.sin(np.outer(th, ks))], 1)
    J = np.asarray(_full_jacobian(dynamics, operator, rho, jnp.asarray(K, rho.dtype)))
    lam = np.linalg.eigvals((B.T * (2 / n)) @ J @ B)
    lam = lam[np.argsort(-lam.real)]
    if drop_rotation:
        lam = np.delete(lam, np.argmin(np.abs(lam)))
    return lam


def branch_from_uniform(dynamics, sigma, *, modes: int = 32, K_max: float, K_min: float = 0.0,
                        ds: float = 0.05, ds_min: float = 1e-6, ds_max: float = 0.2, max_points: int = 400,
                        order_max: float = 0.98, tol: float = 1e-10) -> Branch:
    """The branch of even stationary densities that leaves the uniform law at its first
    instability, followed in K (the value matrix K·V) by pseudo-arclength continuation.

    Args:
        dynamics: ``tp.Sphere(attention)`` on S¹ with Q, K, V multiples of I (SA or USA); V sets
            the unit of K.
        sigma: the noise σ > 0.
        modes: Fourier modes of the densities (a_k for k < modes).
        K_max, K_min: stop when the branch leaves [K_min, K_max].
        ds, ds_min, ds_max: arclength step in (a, K): initial, smallest before
            :class:`ContinuationError`, largest (0 < ds_min <= ds <= ds_max).
        max_points: stop after this many points (>= 2).
        order_max: in (0, 1]; stop once the order parameter exceeds it (the density is then too peaked for
            the modes; the last coefficient is also watched: |a_{M−1}| > 1e-8 stops the branch).
        tol: the Newton tolerance (absolute, on the cosine coefficients of F), > 0.
    """
    check_scalar(sigma, "sigma", positive=True)
    check_int(modes, "modes", minimum=4)
    check_scalar(K_max, "K_max", positive=True)
    check_scalar(K_min, "K_min")
    if not K_min < K_max:
        raise ValueError(f"K_min must be < K_max, got K_min={K_min}, K_max={K_max}")
    check_controls(ds=ds, ds_min=ds_min, ds_max=ds_max, tol=tol, max_points=max_points, order_max=order_max)
    attn, _ = _circle_attention(dynamics)
    J2 = np.array([[0.0, -1.0], [1.0, 0.0]])
    if is_concrete(attn.V) and is_concrete(attn.Q) and is_concrete(attn.K):
        for name, m in (("A = beta KᵀQ", np.asarray(attn.score_matrix())), ("V", np.asarray(attn.V))):
            if abs(np.sum(m * J2)) > 1e-12 * max(1.0, np.max(np.abs(m))):
                raise ValueError(f"{name} = {m.tolist()} has a rotation part (b J): the branches are not "
                                 "reflection symmetric; the continuation needs multiples of I")
    density = CircleDensity(np.ones(2 * modes), sigma)
    if density.values.dtype != jnp.float64:
        raise ValueError(f"branch_from_uniform needs float64 (Newton to tol={tol:g}), got "
                         f"{density.values.dtype}: enable jax_enable_x64")
    M = modes - 1
    a0 = jnp.zeros(M, density.values.dtype)
    jd, jt = _parts(dynamics, density, a0)
    # first instability of the uniform law: jd v = −K jt v, smallest K > 0
    Kb, v = first_instability(jd, jt)
    t = np.concatenate([v, [0.0]])
    u = np.concatenate([np.zeros(M), [Kb]])

    def why(p):
        if not K_min <= p[-1] <= K_max:
            return "K range"
        return "resolution" if abs(p[0]) / 2 > order_max or abs(p[M - 1]) > 1e-8 else None

    U, tangents, stop = pseudo_arclength(
        eqx.Partial(_residual_u, dynamics, density), u, t, ds=ds, ds_min=ds_min, ds_max=ds_max,
        max_points=max_points, tol=tol, stop=why, describe=lambda p: f"K = {p[-1]:.6g} (order {abs(p[0]) / 2:.4g})")
    densities = np.stack([np.asarray(_full(jnp.asarray(p[:-1]), 2 * modes)) for p in U])
    growth = []
    for k, (p, rho) in enumerate(zip(U, densities)):
        rho = jnp.asarray(rho)
        # normalized as CircleDensity would (the grid mean is 1 up to round-off)
        lam = _spectrum(dynamics, density, rho / jnp.mean(rho), p[-1], drop_rotation=k > 0)
        growth.append(float(lam[0].real))
    growth = np.array(growth)
    return Branch(K=U[:, -1], densities=densities, order=np.abs(U[:, 0]) / 2, growth=growth,
                  stable=growth < -1e-9, bifurcation=Kb, folds=folds(U, tangents), modes=modes, stop=stop)


__all__ = ["Branch", "ContinuationError", "branch_from_uniform", "spectrum"]
