r"""The mean field on S², pseudo-spectrally: ∂_tρ = (σ²/2)Δρ − div(ρ∇Ψ[ρ])
(docs: math/noise.md#spectral-solver-on-the-sphere).

ρ is a density against the uniform probability σ on S² (mean 1), held by its coefficients in the
spherical harmonics Y_lm, l <= L (:mod:`.sphere_harmonics`). The field is that of
``tp.Sphere(attention)`` on S² for an attention whose score and value are multiples of the identity
(A = βKᵀQ = aI, V = kI; Q = K = V = I is GLPR's SA/USA, V = K·I the K-scaled noisy USA of
docs: math/noise.md#nonlinear-fokker-planck-equation): it is the gradient ∇Ψ of

    Ψ = k e^{−a·shift} G_aρ / a   (USA),    Ψ = (k/a) log G_aρ   (SA),
    (G_aρ)(x) = ∫ e^{a⟨x,y⟩} ρ(y) dσ(y),  diagonal in Y_lm with the Funk–Hecke eigenvalue
    c_l(a) = sqrt(π/(2a)) I_{l+1/2}(a).

The transport uses scalar transforms only: div(ρ∇Ψ) = ½[Δ(ρΨ) + ρΔΨ − ΨΔρ], with ρ, Δρ, Ψ, ΔΨ
synthesized on the 3/2 grid (products of degree-L functions analyzed back without aliasing). Its
degree-0 coefficient, the divergence's integral, is set to zero: the mass is exact. The diffusion
(σ²/2)Δ is diagonal in Y_lm: the default solver is diffrax's IMEX ``KenCarp4`` with the implicit
stages solved exactly by :class:`~.density.DiagonalSolve`, adaptive steps. :func:`~.density.solve_density`
checks the answer against degree 2L and against tightened steps.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_int, check_scalar, is_concrete, runtime_check
from ..models.attention.softmax import SoftmaxAttention
from ..models.attention.unnormalized import UnnormalizedAttention
from .density import AbstractDensity, DiagonalSolve, sphere_attention
from .sphere_harmonics import SphereTransform, grid_points, laplacian

KERNEL_TAIL = 1e-3
"""The largest accepted c_L(a)/c_0(a): the Funk–Hecke eigenvalue of the kernel e^{a⟨x,y⟩} at the top
degree L relative to its mean. Above it the interaction itself is not resolved at degree L (its
ratio is ≈ e^{−L²/(2a)}: a = β needs L >= 8 at β = 4, L >= 30 at β = 64)."""


def funk_hecke_s2(degree: int, a: float) -> np.ndarray:
    """e^{−a}c_l(a) = e^{−a} sqrt(π/(2a)) I_{l+1/2}(a), l = 0..degree (float64): the scaled eigenvalues
    of ρ ↦ ∫e^{a⟨x,y⟩}ρ(y)dσ(y) on S² (= ``theory.noisy_sphere.funk_hecke(l, a, 3)`` e^{−a})."""
    from scipy import special  # here, not at import: 0.15 s of every process that solves anything

    return np.sqrt(np.pi / (2 * a)) * special.ive(np.arange(degree + 1) + 0.5, a)


def _scalar_multiple(m, name, owner):
    """The c of a 3×3 matrix m = cI; ValueError naming it otherwise."""
    m = np.asarray(m, np.float64)
    c = float(m[0, 0])
    if np.max(np.abs(m - c * np.eye(3))) > 1e-12 * max(1.0, abs(c)):
        raise ValueError(f"the sphere solver needs {owner}.{name} = c·I (a rotation-invariant interaction), got "
                         f"{m.tolist()}")
    return c


class AbstractSpherePotential(eqx.Module):
    """Ψ[ρ] of an attention on S², whose gradient is the field: coefficients to coefficients."""

    @abc.abstractmethod
    def __call__(self, rho, transform: SphereTransform):
        """Ψ's coefficients ``(L+1, L+1)`` (complex) from ρ's."""


class UnnormalizedPotential(AbstractSpherePotential):
    """USA: Ψ = k e^{−a·shift} G_aρ / a, diagonal in Y_lm (its constant dropped: ∇ ignores it)."""

    gains: jax.Array  # (L+1, 1): k e^{a(1−shift)} e^{−a}c_l(a)/a, l = 0 set to 0

    def __call__(self, rho, transform):
        return self.gains * rho


class SoftmaxPotential(AbstractSpherePotential):
    """SA: Ψ = (k/a) log G_aρ, G_aρ synthesized on the grid (scaled by e^{−a}), its log analyzed back."""

    gains: jax.Array  # (L+1, 1): e^{−a}c_l(a)
    scale: jax.Array  # k/a

    def __call__(self, rho, transform):
        return self.scale * transform.analysis(jnp.log(transform.synthesis(self.gains * rho)))


def sphere_potential(dynamics, degree: int, dtype) -> AbstractSpherePotential:
    """The potential Ψ of ``tp.Sphere(attention)`` on S² at degree L; ValueError naming what does not
    fit (not SA/USA, not 3×3, A or V not a multiple of I, β traced or too large for L)."""
    attn = sphere_attention(dynamics, "SphereDensity", "sphere", 3)
    name = type(attn).__name__
    shift = attn.shift if isinstance(attn, UnnormalizedAttention) else 0.0
    if not all(is_concrete(v) for v in (attn.Q, attn.K, attn.V, attn.beta, shift)):
        raise ValueError("the sphere solver computes the Funk–Hecke eigenvalues of its kernel on the host: "
                         f"{name}'s Q, K, V and beta must be concrete (not traced under jit/vmap)")
    a = _scalar_multiple(attn.score_matrix(), "score matrix beta·KᵀQ", name)
    k = _scalar_multiple(attn.V, "V", name)
    if not a > 0:
        raise ValueError(f"the sphere solver needs a positive score beta·KᵀQ = a·I, got a = {a:g}")
    c = funk_hecke_s2(degree, a)
    if c[-1] / c[0] > KERNEL_TAIL:
        need = int(np.argmax(funk_hecke_s2(max(4 * degree, 64) + int(8 * np.sqrt(a)), a) / c[0] <= KERNEL_TAIL))
        raise ValueError(f"SphereDensity: degree {degree} is too low for beta = {a:g}: the kernel e^(beta<x,y>) "
                         f"keeps {c[-1] / c[0]:.2g} of its mean at degree {degree} (at most {KERNEL_TAIL:g}); "
                         f"use degree >= {need}")
    if isinstance(attn, SoftmaxAttention):
        return SoftmaxPotential(jnp.asarray(c[:, None], dtype), jnp.asarray(k / a, dtype))
    gains = k * np.exp(a * (1 - float(shift))) * c / a
    gains[0] = 0.0
    if not np.all(np.isfinite(gains)):
        raise ValueError(f"USA on S² with beta = {a:g}, shift = {float(shift):g}: the field's scale "
                         "e^(beta(1 - shift)) overflows; use shift = 1 (GKPR's normalization)")
    return UnnormalizedPotential(jnp.asarray(gains[:, None], dtype))


def _as_complex(y):
    return jax.lax.complex(y[0], y[1])


def _as_real(c):
    return jnp.stack([jnp.real(c), jnp.imag(c)])


class SphereDensity(AbstractDensity):
    """A density ρ on S² against the uniform probability σ, held by its spherical-harmonic
    coefficients up to degree L, moving by the Fokker–Planck equation of ``tp.Sphere(attention)``
    with independent noise σ on every token: ∂_tρ + div(ρΓ_ρ) = (σ²/2)Δρ.
    ``tp.solve(tp.Sphere(attn), tp.SphereDensity(...), ...)`` saves the coefficients as real arrays
    ``(T, 2, L+1, L+1)`` (real and imaginary parts of c_lm, ``[l, m]``, m <= l;
    :mod:`~transformer_pde.solvers.sphere_harmonics` for the convention).

    Args:
        rho: a function of points ``x`` ``(..., 3)`` returning positive values ``(...)`` (with
            ``degree``: projected on degree <= L by the 3/2 grid), or complex coefficients
            ``(L+1, L+1)`` (``[l, m]``, zero for m > l). Normalized to mass 1; a density not
            positive on the grid, non-finite or of zero mass is a ValueError.
        sigma: the noise σ >= 0 of each token (σ = 0: the continuity equation).
        degree: L when ``rho`` is a function.

    Example:
        ```python
        import numpy as np, transformer_pde as tp

        rho0 = tp.SphereDensity(lambda x: np.exp(x[..., 2]), sigma=0.5, degree=8)   # ρ against σ
        sol = tp.solve(tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0)), rho0, t1=1.0, saveat=np.array([0.0, 1.0]))
        sol.xs.shape                                            # (2, 2, 9, 9): coefficients at the saves
        ```
    """

    coefficients: jax.Array  # (2, L+1, L+1) real: Re, Im of c_lm
    sigma: jax.Array
    transform: SphereTransform
    potential: AbstractSpherePotential | None

    def __init__(self, rho, sigma=0.0, *, degree: int | None = None):
        if callable(rho):
            if degree is None:
                raise ValueError("SphereDensity(function) needs degree=")
            check_int(degree, "degree", minimum=2)
            transform = SphereTransform(degree)
            x = grid_points(transform.nlat, transform.nlon)
            values = np.asarray(rho(x))
            if values.shape != x.shape[:-1]:
                raise ValueError(f"SphereDensity: the function must map points (..., 3) to values (...), got "
                                 f"shape {values.shape} for points of shape {x.shape}")
            self._check_values(values, x, "the density")
            c = transform.analysis(jnp.asarray(values, x.dtype))
        else:
            if degree is not None:
                raise ValueError("degree= is for a function; coefficients set the degree themselves")
            if isinstance(rho, (list, tuple)):
                rho = np.asarray(rho)
            if not isinstance(rho, (np.ndarray, jax.Array)):
                raise ValueError(f"SphereDensity: rho must be a function of points (..., 3) or the density's "
                                 f"coefficients (L+1, L+1), got {type(rho).__name__}")
            if rho.dtype.kind not in "iufc":
                raise ValueError(f"SphereDensity: the density's coefficients must be numbers, got dtype {rho.dtype}")
            c = jnp.asarray(rho)
            if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] < 3:
                raise ValueError(f"SphereDensity needs coefficients of shape (L+1, L+1) with L >= 2, got "
                                 f"shape {c.shape}")
            c = c.astype(jnp.result_type(c.dtype, float, jnp.complex64))
            transform = SphereTransform(c.shape[0] - 1, dtype=jnp.real(c).dtype)
            mask = np.tril(np.ones(c.shape, bool))
            if is_concrete(c) and np.any(np.asarray(c)[~mask] != 0):
                raise ValueError("SphereDensity: coefficients c[l, m] with m > l must be 0")
        sigma = check_scalar(sigma, "SphereDensity.sigma", nonnegative=True)
        mass = jnp.real(c[0, 0])
        if is_concrete(c):
            if not np.isfinite(float(mass)) or float(mass) <= 0:
                raise ValueError(f"SphereDensity: the density has mass {float(mass):.3g}: it is not normalizable")
            c = c / mass
            self._check_values(np.asarray(transform.synthesis(c)), grid_points(transform.nlat, transform.nlon),
                               "the density at degree " + str(transform.degree))
        else:  # traced (under jit/vmap): the same check at run time
            values = transform.synthesis(c / mass)
            c = runtime_check(c / mass, ~(jnp.all(jnp.isfinite(values)) & (jnp.min(values) > 0) & (mass > 0)),
                              "SphereDensity: the density must be finite and positive on the grid (a traced "
                              "density held NaN, inf or a value <= 0)")
        self.coefficients = _as_real(c)
        self.sigma = jnp.asarray(sigma, self.coefficients.dtype)
        self.transform = transform
        self.potential = None

    @staticmethod
    def _check_values(values, x, what):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"SphereDensity: {what} is not finite (NaN or inf on the grid): it is not normalizable")
        if np.min(values) <= 0:
            j = np.unravel_index(int(np.argmin(values)), values.shape)
            raise ValueError(f"SphereDensity: {what} must be positive, got {values[j]:.3g} at x = "
                             f"{np.round(x[j], 4).tolist()}")

    @property
    def degree(self) -> int:
        return self.transform.degree

    @property
    def points(self) -> np.ndarray:
        """The grid ``(nlat, nlon, 3)`` of :meth:`grid_values`."""
        return grid_points(self.transform.nlat, self.transform.nlon)

    @property
    def resolution(self) -> str:
        return f"degree {self.degree}"

    def refined(self):
        L = self.degree
        c = jnp.zeros((2 * L + 1, 2 * L + 1), _as_complex(self.coefficients).dtype)
        return SphereDensity(c.at[: L + 1, : L + 1].set(_as_complex(self.coefficients)), self.sigma)

    def grid_values(self, saved, on):
        L, nlon = saved.shape[-1] - 1, on.transform.nlon
        k = -(-(2 * L + 2) // nlon)  # a finer longitude grid holding degree L, of which on's is every k-th
        t = SphereTransform(L, on.transform.nlat, k * nlon, saved.dtype)
        return t.synthesis(_as_complex(jnp.moveaxis(saved, -3, 0)))[..., ::k]

    def masses(self, saved):
        return saved[..., 0, 0, 0]

    def order_parameter(self, saved):
        """|∫xρ dσ| = (|c_10|² + 2|c_11|²)^{1/2}/√3."""
        c = _as_complex(jnp.moveaxis(saved, -3, 0))
        return jnp.sqrt(jnp.abs(c[..., 1, 0]) ** 2 + 2 * jnp.abs(c[..., 1, 1]) ** 2) / jnp.sqrt(3.0)

    def restart(self, value):
        return eqx.tree_at(lambda s: s.coefficients, self, value)

    def prepare(self, dynamics):
        potential = sphere_potential(dynamics, self.degree, self.coefficients.dtype)
        return eqx.tree_at(lambda s: s.potential, self, potential, is_leaf=lambda v: v is None)

    @property
    def y(self):
        return self.coefficients

    def transport(self, dynamics, y):
        """−div(ρ∇Ψ[ρ]) = −½[Δ(ρΨ) + ρΔΨ − ΨΔρ], its degree-0 coefficient (the mass's rate) set to 0;
        the dynamics entered through :meth:`prepare` (the potential)."""
        c = _as_complex(y)
        lap = laplacian(self.degree, y.dtype)
        psi = self.potential(c, self.transform)
        rho, lap_rho, psi_g, lap_psi = self.transform.synthesis(jnp.stack([c, lap * c, psi, lap * psi]))
        prod = self.transform.analysis(jnp.stack([rho * psi_g, rho * lap_psi - psi_g * lap_rho]))
        div = 0.5 * (lap * prod[0] + prod[1])
        return -_as_real(div.at[0, 0].set(0.0))

    def diffusion(self, y):
        """(σ²/2)Δρ."""
        return (self.sigma**2 / 2) * laplacian(self.degree, y.dtype)[None] * y

    def stage_solver(self):
        """The implicit stage's exact solve: the diffusion is diagonal in the coefficients."""
        return DiagonalSolve()


__all__ = ["AbstractSpherePotential", "KERNEL_TAIL", "SoftmaxPotential", "SphereDensity",
           "UnnormalizedPotential", "funk_hecke_s2", "sphere_potential"]
