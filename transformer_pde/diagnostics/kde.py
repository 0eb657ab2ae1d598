r"""Modes of a Gaussian kernel density estimate of 1-D tokens (docs: math/attention.md#mean-shift-and-kde-modes).

The estimator with bandwidth β^{-1/2} of samples X_1..X_n is

$$\hat P_n(t)=\frac{\sqrt\beta}{n\sqrt{2\pi}}\sum_i e^{-\beta(t-X_i)^2/2}.$$

For X_i ~ N(0, 1) and n^c ≲ β ≲ n^{2−c}, E #modes = Θ(√(β log β)) (KDE paper, Kac–Rice plus
Edgeworth). The authors' code tests ``F_double_prime < 0`` where ``F_double_prime ∝ −P̂''``,
so it selects local **minima** (docs: math/attention.md#mean-shift-and-kde-modes). Here modes are counted directly
as the sign changes + → − of P̂' (over R there is exactly one more mode than minima: P̂' > 0 left of
every sample and < 0 right of every sample).

Self-attention at bandwidth β^{-1/2} is the blurring mean shift (docs: math/attention.md#mean-shift-and-kde-modes;
:class:`transformer_pde.models.MeanShift`): dx_i/dt = Σ_j softmax_j(−β(x_i − x_j)²/2)(x_j − x_i)
= β^{-1} ∂_x log P̂_{μ_t}(x_i), the L2 attention on R minus the identity. Its metastable clusters
track the KDE modes. The √(β log β) law of the expected count is fitted in the ``kde-modes``
experiment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import as_float_array, check_count, check_finite, check_scalar
from .._programs import run_program

__all__ = ["kde_critical_points", "kde_modes"]


def _scaled_derivative(grid, x, beta):
    """sign-preserving P̂'(t): Σ_i (X_i − t) e^{−β(t−X_i)²/2 + m(t)}, m(t) = min_i β(t−X_i)²/2.

    Factoring out the nearest sample's exponent keeps the sign exact where every term would
    underflow (far in the tails at large β).
    """
    diff = x[None, :] - grid[:, None]
    e = beta * diff**2 / 2
    return jnp.sum(diff * jnp.exp(-(e - jnp.min(e, axis=1, keepdims=True))), axis=1)


def _derivative_blocks(blocks, x, beta):
    """:func:`_scaled_derivative` on each row of ``blocks``, one block at a time (memory
    ``block × n``). One program per shape: the samples and β are arguments, not constants."""
    return jax.lax.map(lambda g: _scaled_derivative(g, x, beta), blocks)


_derivative_blocks_jit = jax.jit(_derivative_blocks)


def _bucket(nb: int) -> int:
    """``nb`` rounded up to 2^k or 3·2^(k−1) (at most a third more blocks), so that draws whose grids
    differ by a few points share a compiled program."""
    m = 1 << (nb.bit_length() - 1)  # the largest power of two <= nb
    for size in (m, 3 * m // 2):
        if nb <= size:
            return size
    return 2 * m


def kde_critical_points(samples, beta, *, resolution: float = 0.05, block: int = 2048):
    r"""Numbers of local maxima (modes) and local minima of the Gaussian KDE of ``samples``.

    The derivative is evaluated on a grid of spacing ``resolution``·β^{-1/2} covering the
    samples with a margin of 6β^{-1/2} (P̂' has no zero beyond the extreme samples); a sign
    change + → − is a mode, − → + a minimum. Two critical points closer than the spacing
    would be missed; tests check that halving ``resolution`` changes nothing.

    Returns ``(modes, minima)`` as Python ints.
    """
    samples = check_finite(as_float_array(samples, "samples"), "samples")
    check_scalar(resolution, "resolution", positive=True)
    block = check_count(block, "block", minimum=1)
    x = np.sort(np.asarray(samples, dtype=float).ravel())
    if x.size < 1:
        raise ValueError("kde_critical_points needs at least one sample")
    check_scalar(beta, "beta", positive=True)
    h = resolution / np.sqrt(beta)
    grid = np.arange(x[0] - 6 / np.sqrt(beta), x[-1] + 6 / np.sqrt(beta) + h, h)
    nb = _bucket(-(-grid.size // block))
    gp = np.pad(grid, (0, nb * block - grid.size), mode="edge").reshape(nb, block)
    # through the runs layer's kept programs in a run (a later process loads it), else jitted
    vals = run_program(_derivative_blocks, _derivative_blocks_jit,
                       (jnp.asarray(gp), jnp.asarray(x), jnp.asarray(float(beta))))
    s = np.sign(np.asarray(vals).ravel()[: grid.size])
    s = s[s != 0]
    modes = int(np.sum((s[:-1] > 0) & (s[1:] < 0)))
    minima = int(np.sum((s[:-1] < 0) & (s[1:] > 0)))
    return modes, minima


def kde_modes(samples, beta, **kwargs) -> int:
    """Number of modes (local maxima) of the Gaussian KDE, see :func:`kde_critical_points`."""
    return kde_critical_points(samples, beta, **kwargs)[0]
