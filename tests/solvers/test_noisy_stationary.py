"""The noisy particle system's stationary law against the Fokker–Planck equation's (sphere.md §12).

Noisy USA on S¹, dX_i = K P⊥(1/n)Σ_j e^{β⟨X_i,X_j⟩}X_j dt + σ P⊥∘dB_i, at β = 1.5 < β_* (continuous
transition), integrated as the noisy residual layer (Euler). Above K_#: the time-averaged order
parameter m = |(1/n)ΣX_i| and the aligned Fourier moments ⟨cos k(θ − θ̄)⟩ (k = 1, 2, 3; θ̄ the
angle of the mean) of n = 128 particles against ∫cos kθ ρ dθ/2π of the PDE's stationary density
(``tp.CircleDensity`` run to t = 60, an independent code path), within 4 standard errors over
independent seeds (measured: |z| < 0.3, SE ≈ 0.007; the finite-n bias O(1/n) and the Euler
bias O(h) sit below it). Below K_#: the uniform law, m = O(n^{−1/2}) with the linear-response
value n·E m² = 1/(1 − K/K_#) (the mode-1 Ornstein–Uhlenbeck fluctuation of the empirical measure:
its damping σ²/2 − K g_1 shrinks by 1 − K/K_# while its forcing stays that of free diffusion).
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import transformer_pde as tp

BETA, SIGMA, N, SEEDS = 1.5, 1.0, 128, 8


def _usa(K):
    eye = jnp.eye(2)
    return tp.Sphere(tp.UnnormalizedAttention(eye, eye, K * eye, BETA))


def _stats(t, x, args):
    mean = jnp.mean(x, axis=0)
    th = jnp.arctan2(x[:, 1], x[:, 0]) - jnp.arctan2(mean[1], mean[0])
    return jnp.stack([jnp.mean(jnp.cos(k * th)) for k in (1, 2, 3)] + [jnp.sum(mean**2)])


def test_particle_stationary_law_matches_the_pde():
    K_sharp = tp.theory.noisy_sphere.NoisyUSA(beta=BETA, sigma=SIGMA).critical_coupling()
    Ks = jnp.array([0.6, 1.3]) * K_sharp

    # the PDE's stationary density at K = 1.3 K_#, from a density aligned with θ = 0
    rho = tp.solve(_usa(Ks[1]), tp.CircleDensity(lambda th: 1 + 0.5 * np.cos(th), SIGMA, modes=24), t1=60.0).xs[-1]
    rho = np.asarray(rho)
    grid = 2 * np.pi * np.arange(rho.shape[0]) / rho.shape[0]
    pde = np.array([np.mean(rho * np.cos(k * grid)) for k in (1, 2, 3)])
    assert 0.7 < pde[0] < 0.85  # the clustered branch (≈ 0.777), not the uniform law

    T, h, burn = 30.0, 0.02, 5.0
    ts = jnp.arange(burn, T + h / 2, 0.5)

    def run(K, key, x0):
        return tp.solve(_usa(K), x0, t1=T, dt0=h, saveat=diffrax.SaveAt(ts=ts, fn=_stats), solver=diffrax.Euler(),
                        noise=tp.Noise(SIGMA, path=tp.BrownianIncrements()), key=key, event=None).stats

    keys = jax.random.split(jax.random.key(0), (2, SEEDS))
    # below K_#: i.i.d. uniform; above: a spread cluster at θ = 0 (relaxes within the burn-in)
    ang = jnp.stack([jax.random.uniform(jax.random.key(1), (SEEDS, N), maxval=2 * np.pi),
                     jax.random.normal(jax.random.key(2), (SEEDS, N))])
    x0 = jnp.stack([jnp.cos(ang), jnp.sin(ang)], -1)
    S = np.asarray(jax.jit(jax.vmap(jax.vmap(run, in_axes=(None, 0, 0))))(Ks, keys, x0))
    per_seed = S.mean(axis=2)  # time averages, (K, seed, statistic)
    mu, se = per_seed.mean(1), per_seed.std(1, ddof=1) / np.sqrt(SEEDS)

    assert np.all(se[1, :3] < 0.02)
    np.testing.assert_array_less(np.abs(mu[1, :3] - pde), 4 * se[1, :3])
    # below K_#: uniform, n E m² = 1/(1 − K/K_#) = 2.5 (and m = O(n^{-1/2}))
    assert abs(N * mu[0, 3] - 1 / (1 - 0.6)) < 4 * N * se[0, 3]
    assert np.sqrt(mu[0, 3]) < 3 / np.sqrt(N)
