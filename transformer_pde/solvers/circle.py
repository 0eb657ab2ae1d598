r"""The mean field on the circle, pseudo-spectrally: ∂_tρ + ∂_θ(ρ v[ρ]) = (σ²/2)∂²_θρ
(docs: math/noise.md#spectral-solver-on-the-circle).

ρ is a density against the uniform probability dθ/2π on S¹ (mean 1), held by its values on the
grid θ_j = 2πj/N, N = 2·modes. The field is that of ``tp.Sphere(attention)`` on S¹ for an
attention whose score depends on the angle only — the matrices A = βKᵀQ and V commute with the
rotation J (A, V ∈ {aI + bJ}; Q = K = V = I is GLPR's SA/USA, V = K·I the K-scaled noisy
USA, docs: math/noise.md#nonlinear-fokker-planck-equation): with s(ψ) = e(ψ)ᵀA e(0) and
h(ψ) = ⟨V e(ψ), e(0)^⊥⟩, e(ψ) = (cos ψ, sin ψ),

    v[ρ](θ) = ∫ e^{s(ψ)} h(ψ) ρ(θ+ψ) dψ/2π ÷ Z(θ),   Z = ∫ e^{s(ψ)} ρ(θ+ψ) dψ/2π (SA, softmax)
                                                     or e^{βc} (USA, ``shift`` c),

two cross-correlations by FFT. :class:`CircleDensity` is a state of ``tp.solve``: its term splits
into the transport −∂_θ(ρv) (explicit) and the diffusion (σ²/2)∂²_θρ (implicit: stiff, its
eigenvalues −σ²k²/2 reach −σ²·modes²/2). Its default solver is diffrax's IMEX ``KenCarp4`` whose
implicit stages are solved exactly by :class:`~.density.CirculantSolve` (the diffusion is circulant on the
grid: one FFT per solve, no dense Jacobian), with an adaptive ``PIDController`` by default.
Mass (the k = 0 mode) is conserved to round-off. :func:`solve_density` adds the checks: the run is
repeated with twice the modes and with tightened steps and compared, and positivity is watched;
too few modes or too coarse steps for ``tol`` is :class:`UnderResolvedError` (or a flagged
:class:`DensitySolution` with ``throw=False``).
Noiseless (σ = 0) the same solver runs for as long as the density stays resolved.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_int, check_scalar, is_concrete, runtime_check
from ..models.attention.softmax import SoftmaxAttention
from .density import (
    AbstractDensity,
    CirculantSolve,
    DensitySolution,
    LinearStageSolve,
    UnderResolvedError,
    solve_density,
    sphere_attention,
)

_J = np.array([[0.0, -1.0], [1.0, 0.0]])


def grid(modes: int, dtype=None) -> jax.Array:
    """θ_j = 2πj/N, N = 2·modes."""
    check_int(modes, "modes", minimum=2)
    return 2 * jnp.pi * jnp.arange(2 * modes, dtype=dtype or jnp.result_type(float)) / (2 * modes)


def _circle_attention(dynamics):
    """(attention, normalized) of ``tp.Sphere(attention)`` on S¹; ValueError naming what does not fit."""
    attn = sphere_attention(dynamics, "CircleDensity", "circle", 2)
    if is_concrete(attn.Q) and is_concrete(attn.K) and is_concrete(attn.V) and is_concrete(attn.beta):
        for name, m in (("A = beta KᵀQ", np.asarray(attn.score_matrix())), ("V", np.asarray(attn.V))):
            if np.max(np.abs(m @ _J - _J @ m)) > 1e-12 * max(1.0, np.max(np.abs(m))):
                raise ValueError(f"{name} = {m.tolist()} does not commute with rotations: the score or "
                                 "value is not a function of the angle (needs a I + b J)")
    return attn, isinstance(attn, SoftmaxAttention)


def _kernels(attn, n: int, dtype):
    """FFTs of e^{s(ψ)−s_max}·h(ψ) and e^{s(ψ)−s_max} on the n-grid, and s_max."""
    psi = 2 * jnp.pi * jnp.arange(n, dtype=dtype) / n
    e = jnp.stack([jnp.cos(psi), jnp.sin(psi)], 1)
    A = attn.score_matrix().astype(dtype)
    s = e @ A @ jnp.asarray([1.0, 0.0], dtype)  # e(ψ)ᵀ A e(0)
    h = (e @ attn.V.astype(dtype).T)[:, 1]  # ⟨V e(ψ), e(0)^⊥⟩
    smax = jnp.max(s)
    w = jnp.exp(s - smax)
    return jnp.fft.rfft(w * h), jnp.fft.rfft(w), smax


def _correlate(rho_hat, w_hat, n):
    """∫ w(ψ) ρ(θ+ψ) dψ/2π on the grid, from rfft(ρ) and rfft(w)."""
    return jnp.fft.irfft(rho_hat * jnp.conj(w_hat), n) / n


def _wavenumbers(n, dtype):
    k = jnp.fft.rfftfreq(n, 1.0 / n).astype(dtype)
    return k.at[-1].set(0.0)  # the Nyquist mode of an even grid is dropped


def circle_velocity(dynamics, rho):
    """v[ρ] on the grid of ``rho`` (values of a density against dθ/2π), for a dynamics that
    :class:`CircleDensity` accepts (unchecked here)."""
    attn = dynamics.dynamics
    normalized = isinstance(attn, SoftmaxAttention)
    n = rho.shape[-1]
    wh_hat, w_hat, smax = _kernels(attn, n, rho.dtype)
    rho_hat = jnp.fft.rfft(rho)
    num = _correlate(rho_hat, wh_hat, n)
    if normalized:
        return num / _correlate(rho_hat, w_hat, n)
    return num * jnp.exp(smax - attn.beta * attn.shift)


class CircleDensity(AbstractDensity):
    """A density ρ on S¹ against dθ/2π, on the grid θ_j = 2πj/N (N = 2·modes), moving by the
    Fokker–Planck equation of ``tp.Sphere(attention)`` with independent noise σ on every token:
    ∂_tρ + ∂_θ(ρ v[ρ]) = (σ²/2)∂²_θρ. ``tp.solve(tp.Sphere(attn), tp.CircleDensity(...), ...)``
    saves the grid values ``(T, N)``.

    Args:
        rho: positive values on the grid (N even, N >= 4), or a function of θ (with ``modes``);
            normalized to mean 1. Non-positive, non-finite or zero-mass input is a ValueError.
        sigma: the noise σ >= 0 of each token (σ = 0: the continuity equation).
        modes: Fourier modes when ``rho`` is a function.

    On S²: :class:`~transformer_pde.SphereDensity`, with our own transforms. s2fft 1.5.0 was
    measured 2026-11-26 (issue 21): it runs with jax 0.10.2 but each transform compiles for 20–35 s
    and a jitted round trip took 260 ms at L = 64 on this 2-core machine, seconds per IMEX step.
    Zonal densities on S^{d−1}: :class:`~transformer_pde.ZonalDensity` (a 1-D Gegenbauer problem).

    Example:
        ```python
        import numpy as np, transformer_pde as tp

        rho0 = tp.CircleDensity(lambda th: 1 + 0.2 * np.cos(th), sigma=0.5, modes=16)   # ρ against dθ/2π
        sol = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(2, 1.0)), rho0, t1=1.0, saveat=np.array([0.0, 1.0]))
        sol.xs.shape                                            # (2, 32): the grid values at the saves
        ```
    """

    values: jax.Array
    sigma: jax.Array

    def __init__(self, rho, sigma=0.0, *, modes: int | None = None):
        if callable(rho):
            if modes is None:
                raise ValueError("CircleDensity(function) needs modes=")
            rho = rho(np.asarray(grid(modes)))  # float64 with x64, else float32 (no truncation warning)
        elif modes is not None:
            raise ValueError("modes= is for a function; grid values set the modes themselves")
        rho = as_float_array(rho, "CircleDensity.rho")
        sigma = check_scalar(sigma, "CircleDensity.sigma", nonnegative=True)
        if rho.ndim != 1 or rho.shape[0] < 4 or rho.shape[0] % 2:
            raise ValueError(f"CircleDensity needs values on an even grid of N >= 4 points, got shape {rho.shape}")
        if is_concrete(rho):
            r = np.asarray(rho)
            if not np.all(np.isfinite(r)):
                raise ValueError("CircleDensity: the density is not finite (NaN or inf on the grid): "
                                 "it is not normalizable")
            if np.min(r) <= 0:
                j = int(np.argmin(r))
                raise ValueError(f"CircleDensity: the density must be positive, got {r[j]:.3g} at "
                                 f"theta = {2 * np.pi * j / r.size:.4g}")
        else:  # traced (under jit/vmap): the same check at run time
            rho = runtime_check(rho, ~(jnp.all(jnp.isfinite(rho)) & (jnp.min(rho) > 0)),
                                "CircleDensity: the density must be finite and positive on the grid (a traced "
                                "density held NaN, inf or a value <= 0)")
        self.values = rho / jnp.mean(rho)
        self.sigma = jnp.asarray(sigma, self.values.dtype)

    @property
    def modes(self) -> int:
        return self.values.shape[0] // 2

    @property
    def resolution(self) -> str:
        return f"{self.modes} modes"

    def refined(self):
        return CircleDensity(refine(self.values, 2 * self.modes), self.sigma)

    def grid_values(self, saved, on):
        # the grid of 2^k·N points holds the N-point grid: every 2^k-th point
        return saved[..., :: saved.shape[-1] // on.values.shape[0]]

    def masses(self, saved):
        return jnp.mean(saved, -1)

    def order_parameter(self, saved):
        return order_parameter(saved)

    def restart(self, value):
        return eqx.tree_at(lambda s: s.values, self, value)

    def prepare(self, dynamics):
        _circle_attention(dynamics)
        return self

    @property
    def y(self):
        return self.values

    def transport(self, dynamics, rho):
        """−∂_θ(ρ v[ρ])."""
        n = rho.shape[0]
        flux_hat = jnp.fft.rfft(rho * circle_velocity(dynamics, rho))
        return -jnp.fft.irfft(1j * _wavenumbers(n, rho.dtype) * flux_hat, n)

    def diffusion(self, rho):
        """(σ²/2)∂²_θρ."""
        n = rho.shape[0]
        k = _wavenumbers(n, rho.dtype)
        return jnp.fft.irfft(-(self.sigma**2 / 2) * k**2 * jnp.fft.rfft(rho), n)

    def stage_solver(self):
        """The implicit stage's exact solve: the diffusion is circulant on the grid."""
        return CirculantSolve()


def imex_solver(solver: type[diffrax.AbstractSolver] = diffrax.KenCarp4):
    """A diffrax IMEX solver (``KenCarp3/4/5``) whose implicit stages (the diffusion) are solved
    exactly by :class:`~.density.LinearStageSolve` with :class:`~.density.CirculantSolve`: the default of
    :class:`CircleDensity`."""
    return solver(root_finder=LinearStageSolve())


# ------------------------------------------------------------------------------ checked solves


def order_parameter(rho):
    """|∫e^{iθ}ρ dθ/2π| = |(1/n)Σ X_i| of the law: the first Fourier coefficient's modulus."""
    n = rho.shape[-1]
    return jnp.abs(jnp.fft.rfft(rho, axis=-1)[..., 1]) / n


def fourier_coefficients(rho):
    """ρ̂_k = ∫ρ e^{−ikθ}dθ/2π for k = 0..N/2 (last axis)."""
    return jnp.fft.rfft(rho, axis=-1) / rho.shape[-1]


def refine(rho, modes: int):
    """Grid values of ``rho`` on the grid of ``modes`` modes (spectral interpolation or truncation)."""
    n, m = rho.shape[-1], 2 * modes
    c = jnp.fft.rfft(rho, axis=-1)
    c = c.at[..., -1].set(0.0)
    if m >= n:
        c = jnp.concatenate([c, jnp.zeros(c.shape[:-1] + (m // 2 + 1 - c.shape[-1],), c.dtype)], -1)
    else:
        c = c[..., : m // 2 + 1].at[..., -1].set(0.0)
    return jnp.fft.irfft(c, m, axis=-1) * (m / n)


__all__ = ["CircleDensity", "DensitySolution", "UnderResolvedError", "circle_velocity",
           "fourier_coefficients", "grid", "imex_solver", "order_parameter", "refine",
           "solve_density"]
