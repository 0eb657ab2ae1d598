r"""Lost in the middle (LitM, Duerinckx–Geshkovski–Rossi): the closed forms of the retrieval profile
(docs: math/causal.md#lost-in-the-middle).

The particle model is :class:`~transformer_pde.LostInTheMiddle` (causal USA with ALiBi weights
over k < j, self excluded, on the torus, in angles),

$$\theta_j'=\mathcal Z_{N,j}^{-1}\sum_{k<j}e^{-\lambda(j-k)/N}w_\beta'(\theta_j-\theta_k),\qquad
w_\beta(\theta)=e^{\beta\cos\theta},\quad \mathcal Z_{N,j}=\sum_{k<j}e^{-\lambda(j-k)/N};$$

here its mean field over (σ, θ) (cursor σ ∈ (0, 1]; :class:`LostInTheMiddleMeanField`, a
pseudo-spectral solver) and its closed forms: the Volterra kernel ``k_λ``, the solution ``g_a`` of
the linearized (Volterra–Hardy) equation and the retrieval profile ``S_t(σ0)``.

Derivation of the retrieval profile [derived, checked in tests/models/test_lost_in_the_middle.py]. Expand
w_β(θ) = Σ_n I_n(β) e^{inθ}. For i.i.d. uniform tokens, u_j = E e^{in(θ_j(t) − θ_{i*}(0))} is
O(1/N) for j > i*, and to first order only the m = −n Fourier mode of w_β' couples it back:
u_j' = a_n Σ_{k<j} K_{jk} u_k with a_n = n² I_n(β), K_{jk} the ALiBi weights and u_{i*} ≈ 1.
With K_{jk} ≈ k_λ(σ_j, σ_k)/N and u_j = g(σ_j)/N this is the Volterra equation below. Its
Neumann series is g = Σ_m (at)^m/m! k^{*m}(σ, σ0) with k^{*m} = k_λ(σ, σ0) Y^{m-1}/(m-1)!
(the kernel is λe^{λσ'}/(e^{λσ}−1), so each convolution integrates λe^{λs}/(e^{λs}−1)), which
sums to the Bessel form g_a = k_λ √(at/Y) I_1(2√(atY)).
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import check_count, check_in_range, check_int, check_real, check_scalar, is_concrete
from ..models.lost_in_the_middle import LostInTheMiddle
from ..params import scalar_param
from ..solvers import AbstractODE, solve

__all__ = [
    "LostInTheMiddleMeanField",
    "bessel_i",
    "litm_kernel",
    "retrieval_discrete",
    "retrieval_profile",
    "retrieval_weights",
    "smallness_holds",
    "u_shape",
    "volterra_closed_form",
    "volterra_numerical",
]


# ---------------------------------------------------------------------------------------------
# Closed forms of the linearized mean field (docs: math/causal.md#lost-in-the-middle, LitM)


def bessel_i(n, beta, num_nodes: int = 128):
    r"""Modified Bessel function I_n(β) of integer order, in JAX.

    Uses I_n(β) = (1/2π)∫_0^{2π} e^{β cos θ} cos(nθ) dθ, whose trapezoid rule on a periodic
    integrand converges geometrically (exact to rounding for |β| ≲ num_nodes/4 and
    |n| < num_nodes/2). This is also the Fourier coefficient of w_β(θ) = e^{β cos θ}.
    """
    num_nodes = check_int(num_nodes, "num_nodes", minimum=1)
    if is_concrete(beta):  # a traced β (the LitM right-hand side) was checked where it was built
        check_real(beta, "beta")
    theta = 2 * jnp.pi * jnp.arange(num_nodes) / num_nodes
    n, beta = jnp.broadcast_arrays(jnp.asarray(n), jnp.asarray(beta))  # orders × β, broadcast
    theta = theta.reshape((1,) * beta.ndim + theta.shape)
    vals = jnp.exp(beta[..., None] * jnp.cos(theta)) * jnp.cos(n[..., None] * theta)
    return jnp.mean(vals, axis=-1)


def litm_kernel(sigma, sigma_p, lam):
    r"""k_λ(σ, σ') = λ e^{−λ(σ−σ')}/(1 − e^{−λσ}) for σ' < σ (0 otherwise); 1/σ at λ = 0.

    The continuum limit of N times the normalized ALiBi weights: ∫_0^σ k_λ(σ, σ') dσ' = 1.
    """
    if is_concrete(lam):  # traced inside the Volterra closed form: checked where it enters
        check_real(lam, "lam", nonnegative=True)
    sigma, sigma_p = jnp.broadcast_arrays(jnp.asarray(sigma), jnp.asarray(sigma_p))
    lam = jnp.asarray(lam, dtype=jnp.result_type(sigma, sigma_p, float))
    lam_safe = jnp.where(lam > 0, lam, 1.0)
    val = jnp.where(lam > 0, lam_safe * jnp.exp(-lam * (sigma - sigma_p)) / -jnp.expm1(-lam_safe * sigma),
                    1.0 / sigma)
    return jnp.where(sigma_p < sigma, val, 0.0)


def _log_gap(sigma, sigma0, lam):
    """Y = log((e^{λσ} − 1)/(e^{λσ0} − 1)) (λ → 0: log(σ/σ0))."""
    lam_safe = jnp.where(lam > 0, lam, 1.0)
    y_lam = jnp.log(jnp.expm1(lam_safe * sigma)) - jnp.log(jnp.expm1(lam_safe * sigma0))
    return jnp.where(lam > 0, y_lam, jnp.log(sigma / sigma0))


def _check_volterra(a, t, sigma0, lam, sigma=None):
    """Concrete arguments of the Volterra closed form, checked (ValueError naming the bad one): a
    finite (a_n = n² I_n(β) of large n is ~0 and may round below 0: at·Y is clamped at 0), t >= 0,
    σ0 (and σ) > 0 (positions in (0, 1]), λ >= 0; traced values are the caller's (checked where
    they were made)."""
    if is_concrete(a):
        check_real(a, "a")
    for name, v in (("t", t), ("lam", lam)):
        if is_concrete(v):
            check_real(v, name, nonnegative=True)
    for name, v in (("sigma0", sigma0), ("sigma", sigma)):
        if v is not None and is_concrete(v):
            check_real(v, name, positive=True)


def volterra_closed_form(a, t, sigma, sigma0, lam):
    r"""g_a(t, σ; σ0) = k_λ(σ, σ0) √(at/Y) I_1(2√(atY)), Y = log((e^{λσ}−1)/(e^{λσ0}−1)).

    Solves ∂_t g = a(k_λ(σ, σ0) + ∫_{σ0}^σ k_λ(σ, σ') g(σ') dσ'), g(0) = 0
    (docs: math/causal.md#lost-in-the-middle). Written as k_λ · at · (2 I_1(z)/z) with z = 2√(atY), which is 1 at
    z = 0 (σ → σ0).
    """
    _check_volterra(a, t, sigma0, lam, sigma=sigma)
    # NumPy broadcasting of all four arguments, made explicit
    a, t, sigma, sigma0 = jnp.broadcast_arrays(*(jnp.asarray(v) for v in (a, t, sigma, sigma0)))
    at = a * t
    Y = jnp.maximum(_log_gap(sigma, sigma0, jnp.asarray(lam)), 0.0)
    z = 2 * jnp.sqrt(jnp.maximum(at * Y, 0.0))  # a_n for large n is ~0 up to rounding
    small = z < 1e-4
    zs = jnp.where(small, 1.0, z)
    # 2 I_1(z)/z = Σ (z/2)^{2m}/(m!(m+1)!) = 1 + z²/8 + ...; i1e avoids overflow
    ratio = jnp.where(small, 1 + z**2 / 8, 2 * jax.scipy.special.i1e(zs) * jnp.exp(zs) / zs)
    return jnp.where(sigma > sigma0, litm_kernel(sigma, sigma0, lam) * at * ratio, 0.0)


def volterra_numerical(a, t, sigma0, lam, num_points: int = 401):
    r"""Solve ∂_t g = a(k_λ(σ,σ0) + ∫_{σ0}^σ k_λ(σ,σ') g dσ') directly (no Bessel function).

    Trapezoid quadrature on a uniform σ-grid of [σ0, 1] turns the equation into the linear
    ODE g' = a(k0 + W g), g(0) = 0, solved exactly by its exponential series
    g(t) = Σ_{m>=1} (at)^m/m! W^{m−1} k0 (summed until the terms underflow; ‖W‖ <= 1 since
    the kernel integrates to one). Second order in the grid.

    Returns ``(sigma_grid, g)``.
    """
    check_scalar(a, "a")
    check_scalar(t, "t")
    check_scalar(lam, "lam", nonnegative=True)
    check_in_range(sigma0, "sigma0", low=0.0, high=1.0, low_open=True, high_open=True,
                   meaning="the source's position, the left end of the grid [sigma0, 1]")
    num_points = check_count(num_points, "num_points", minimum=2)
    s = np.linspace(float(sigma0), 1.0, num_points)
    h = s[1] - s[0]
    S, Sp = np.meshgrid(s, s, indexing="ij")
    kmat = np.array(litm_kernel(S, Sp, lam))
    # the kernel is continuous up to σ' = σ: use its limit on the diagonal
    diag = lam / -np.expm1(-lam * s) if lam > 0 else 1.0 / s
    kmat[np.arange(num_points), np.arange(num_points)] = diag
    quad = np.full(num_points, h)
    W = np.zeros((num_points, num_points))
    for i in range(1, num_points):  # trapezoid on [σ0, σ_i]
        w = quad[: i + 1].copy()
        w[0] = w[i] = h / 2
        W[i, : i + 1] = kmat[i, : i + 1] * w
    # g jumps at σ0 (g(σ0) = 0 but g(σ0+) = at·k_λ(σ0, σ0)): the grid carries the right limit
    k0 = kmat[:, 0].copy()
    W[0] = 0.0
    return s, _exp_series(W, k0, float(a) * float(t))


def _exp_series(W, v, at, tol=1e-17):
    """Σ_{m>=1} at^m/m! W^{m−1} v = (expm(at W) − I) W^{-1} v, by the series (plain NumPy)."""
    term = at * np.asarray(v, dtype=float)
    total = term.copy()
    for m in range(2, 10_000):
        term = (at / m) * (W @ term)
        total += term
        if np.abs(term).max() <= tol * max(np.abs(total).max(), 1e-300):
            break
    return total


def retrieval_weights(M: int, n_max: int):
    """Fourier weights ω_n = e^{−π²n²/(2M²)}, n = 1..n_max, of the soft accuracy."""
    M = check_count(M, "M", minimum=1)
    n = np.arange(1, check_count(n_max, "n_max", minimum=1) + 1)
    return np.exp(-(np.pi**2) * n**2 / (2 * M**2))


def retrieval_profile(t, sigma0, beta, lam, M: int = 8, n_max: int = 20):
    r"""S_t(σ0) = Σ_{n>=1} e^{−π²n²/(2M²)} g_{a_n}(t, 1; σ0), a_n = n² I_n(β)
    (docs: math/causal.md#lost-in-the-middle).

    The soft retrieval accuracy of the source at σ0 is
    A_N = √(π/2)/M + √(2π)/(MN) S_t(σ0) + o(1/N).
    """
    M, n_max = check_count(M, "M", minimum=1), check_count(n_max, "n_max", minimum=1)
    check_scalar(beta, "beta", nonnegative=True)  # a_n = n² I_n(β) >= 0: the closed form's a >= 0
    _check_volterra(0.0, t, sigma0, lam)
    n = jnp.arange(1, n_max + 1)
    a = n**2 * bessel_i(n, jnp.asarray(beta, dtype=float))
    om = jnp.asarray(retrieval_weights(M, n_max))
    sigma0 = jnp.asarray(sigma0, dtype=float)
    g = volterra_closed_form(a.reshape(-1, *([1] * sigma0.ndim)), t, 1.0, sigma0, lam)
    return jnp.tensordot(om, g, axes=1)


def smallness_holds(t, beta, lam, n_max: int = 64) -> bool:
    """The LitM U-shape condition t·sup_n a_n <= min{3 − √3, 2(1 − e^{−λ})}."""
    n_max = check_count(n_max, "n_max", minimum=1)
    check_scalar(beta, "beta")
    check_scalar(t, "t", nonnegative=True)
    check_scalar(lam, "lam", nonnegative=True)
    n = np.arange(1, n_max + 1)
    a = n**2 * np.asarray(bessel_i(jnp.asarray(n), jnp.asarray(float(beta))))
    return bool(t * a.max() <= min(3 - np.sqrt(3), 2 * (1 - np.exp(-lam))))


def u_shape(profile) -> dict:
    """Primacy, recency and uniqueness of the interior minimum of a sampled profile.

    Returns booleans: ``primacy`` (the profile decreases from its first sample to its
    minimum), ``recency`` (it increases over the last interval), ``unique_min`` (the discrete
    derivative changes sign exactly once, − then +), and ``argmin``.
    """
    check_real(profile, "profile")
    p = np.asarray(profile)
    if p.ndim != 1 or p.size < 2:
        raise ValueError(f"profile must be a vector of at least 2 samples, got shape {p.shape}")
    dp = np.diff(p)
    signs = np.sign(dp[dp != 0])
    changes = int(np.sum(signs[1:] != signs[:-1]))
    i = int(np.argmin(p))
    return {
        "primacy": bool(p[0] > p[i] and dp[0] < 0),
        "recency": bool(dp[-1] > 0),
        "unique_min": bool(changes == 1 and signs[0] < 0 and 0 < i < len(p) - 1),
        "argmin": i,
    }


def retrieval_discrete(t, n: int, beta, lam, M: int = 8, n_max: int = 20):
    r"""The finite-N linearization: u' = a_n K(u + e_{i*}) with the exact ALiBi matrix K.

    N·u_N(t) for each source i* = 1..N−1, summed with the weights ω_n: the finite-N
    counterpart of S_t(σ0) (it converges to it as N → ∞, see the module docstring).
    """
    n = check_count(n, "n", minimum=2)
    M, n_max = check_count(M, "M", minimum=1), check_count(n_max, "n_max", minimum=1)
    check_scalar(t, "t", nonnegative=True)
    K = np.asarray(LostInTheMiddle(beta, lam).position_weights(n))
    ns = np.arange(1, n_max + 1)
    a = ns**2 * np.asarray(bessel_i(jnp.asarray(ns), jnp.asarray(float(beta))))
    om = retrieval_weights(M, n_max)
    out = np.zeros(n - 1)
    for an, w in zip(a, om):
        # v = u + e_{i*} solves v' = aKv (K strictly lower triangular, so the source and the
        # tokens before it stay put), v(0) = e_{i*}: u_N(t) = expm(atK)[N, i*], i.e. the last
        # row of expm(atK) = e_Nᵀ + Σ_{m>=1} (at)^m/m! e_Nᵀ K^m (K is nilpotent: finite sum)
        row = _exp_series(K.T, K[n - 1], an * t)  # (Kᵀ)^{m−1} K_N = (e_Nᵀ K^m)ᵀ
        out += w * n * row[: n - 1]
    return np.arange(1, n) / n, out


# ---------------------------------------------------------------------------------------------
# Mean field over (σ, θ) (docs: math/causal.md#lost-in-the-middle)


class LostInTheMiddleMeanField(AbstractODE):
    r"""The LitM mean field on (0, 1] × T, discretized in σ and pseudo-spectral in θ:

    $$\partial_tf=-\partial_\theta(fV[f]),\qquad V[f](\sigma,\theta)=\int_0^\sigma k_\lambda(\sigma,\sigma')
    (w_\beta'*_\theta f)(\sigma',\theta)\,d\sigma'.$$

    The cursor is discretized in ``num_sigma`` cells σ_i = i/S with the exact ALiBi weights
    K_{ik} (row-normalized over k < i, the N = S particle weights; K_{ik} → k_λ(σ_i, σ_k)/S), so
    that the density of cell i is the law of token i. In θ, f lives on ``num_theta`` equispaced
    points; the convolution uses w_β' = Σ_n in I_n(β) e^{inθ}, so
    (w_β' * f)^_n = 2π in I_n(β) f̂_n. Each row f(σ_i, ·) is a probability density (∫ f dθ = 1).

    Linearized at the uniform density, the Fourier mode n obeys ĥ_n' = a_n K ĥ_n with
    a_n = n² I_n(β): the Volterra equation of :func:`volterra_closed_form` (tested).
    """

    beta: jax.Array
    lam: jax.Array
    num_sigma: int = eqx.field(static=True)
    num_theta: int = eqx.field(static=True)

    def __init__(self, beta, lam, num_sigma: int = 64, num_theta: int = 64):
        check_scalar(beta, "beta", nonnegative=True)
        check_scalar(lam, "lam", nonnegative=True)
        num_sigma = check_count(num_sigma, "num_sigma", minimum=2)
        num_theta = check_count(num_theta, "num_theta", minimum=4)
        if num_theta % 2:
            raise ValueError(f"need num_sigma >= 2 and an even num_theta >= 4, got {num_sigma}, "
                             f"{num_theta}")
        self.beta, self.lam = scalar_param(beta), scalar_param(lam)
        self.num_sigma, self.num_theta = int(num_sigma), int(num_theta)

    @property
    def theta(self):
        return 2 * jnp.pi * jnp.arange(self.num_theta) / self.num_theta

    @property
    def sigma(self):
        return jnp.arange(1, self.num_sigma + 1) / self.num_sigma

    def rhs(self, t, f):
        M = self.num_theta
        n = jnp.fft.fftfreq(M, 1.0 / M)
        In = bessel_i(jnp.abs(n), self.beta, num_nodes=max(128, 2 * M))
        fhat = jnp.fft.fft(f, axis=1) / M  # (1/2π)∫ f e^{-inθ} dθ
        conv = jnp.real(jnp.fft.ifft(2 * jnp.pi * 1j * (n * In)[None, :] * fhat, axis=1) * M)
        K = LostInTheMiddle(self.beta, self.lam).position_weights(self.num_sigma, f.dtype)
        flux = f * (K @ conv)
        return -jnp.real(jnp.fft.ifft(1j * n[None, :] * jnp.fft.fft(flux, axis=1), axis=1))

    def solve(self, f0, t1, *, dt0=0.01, saveat=None):
        """Integrate from the densities ``f0`` (shape (num_sigma, num_theta)) with Tsit5."""
        f0 = jnp.asarray(f0)
        if f0.shape != (self.num_sigma, self.num_theta):
            raise ValueError(f"f0 must have shape ({self.num_sigma}, {self.num_theta}), got {f0.shape}")
        check_scalar(t1, "t1", positive=True)
        ts = jnp.asarray([t1] if saveat is None else saveat, f0.dtype)
        return solve(self, f0, t1=t1, dt0=dt0, saveat=ts, max_steps=100_000,
                     stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10)).xs
