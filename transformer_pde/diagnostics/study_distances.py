r"""The transport distance a convergence study measures between μ^n_t and its mean-field reference
(docs: math/mean_field.md#mean-field-convergence), a value the study is given: exact on R (W₁, W₂
from quantile functions) and on S¹ (W₁ from cumulative functions), no ε; elsewhere W₂ ≈ √(Sinkhorn
divergence) with ε relative to the reference measure's scale, NaN and counted when it does not
converge."""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp

from .._checks import check_count, check_scalar
from .distances import sinkhorn_wasserstein_status
from .distances_1d import wasserstein_circle, wasserstein_line
from .moments import unchecked_moments as empirical_moments  # per save: no checks


class AbstractStudyDistance(eqx.Module):
    """The transport distance a study measures between two weighted measures Σ a_i δ_{x_i} and
    Σ b_j δ_{y_j} (:meth:`between`; called with μ^n_t, uniform ``x``, and the reference measure):
    returns ``w1``, ``w2`` (NaN where not computed) and ``unconverged`` (True where an iterative
    solve did not converge: its value is then NaN)."""

    @abc.abstractmethod
    def between(self, x, a, y, b) -> dict:
        ...

    def __call__(self, x, y, b) -> dict:
        return self.between(x, jnp.full(x.shape[:1], 1.0 / x.shape[0], x.dtype), y, b)

    @property
    def exact(self) -> bool:
        return True


class ExactLine(AbstractStudyDistance):
    """On R: exact W_1 and W_2 from the quantile functions (:func:`wasserstein_line`)."""

    def between(self, x, a, y, b):
        return {"w1": wasserstein_line(x, y, a, b, p=1.0), "w2": wasserstein_line(x, y, a, b, p=2.0),
                "unconverged": jnp.zeros((), bool)}

    def __str__(self):
        return "exact W1, W2 on R (quantile functions)"


class ExactCircle(AbstractStudyDistance):
    """On S¹: exact W_1 for the arc length, from the cumulative functions
    (:func:`wasserstein_circle`); no W_2."""

    def between(self, x, a, y, b):
        return {"w1": wasserstein_circle(x, y, a, b), "w2": jnp.full((), jnp.nan, x.dtype),
                "unconverged": jnp.zeros((), bool)}

    def __str__(self):
        return "exact W1 on the circle (cumulative functions)"


def _positive(value, name: str) -> float:
    """A finite real number > 0, as a float (ValueError naming ``name`` otherwise)."""
    return float(check_scalar(value, name, positive=True))


class SinkhornDistance(AbstractStudyDistance):
    r"""W_2 ≈ √S_ε (debiased Sinkhorn divergence, ott-jax) with ε relative to the data's scale:
    ε = ``epsilon`` · tr Cov(ν), ν the reference measure at the time of measurement (the bias is
    O(ε²) for smooth data). A solve that does not reach ``threshold`` in ``max_iterations`` gives
    NaN and ``unconverged`` (the study counts and warns; it does not stop)."""

    epsilon: float = eqx.field(static=True, default=0.01, converter=lambda v: _positive(v, "epsilon"))
    max_iterations: int = eqx.field(static=True, default=2000,
                                    converter=lambda v: check_count(v, "max_iterations", minimum=1))
    threshold: float = eqx.field(static=True, default=1e-4, converter=lambda v: _positive(v, "threshold"))

    def between(self, x, a, y, b):
        _, S = empirical_moments(y, b)
        eps = self.epsilon * jnp.maximum(jnp.trace(S), jnp.finfo(x.dtype).tiny)
        batch = None if x.shape[0] * y.shape[0] <= (1 << 24) else 1024
        w, converged = sinkhorn_wasserstein_status(x, y, a, b, epsilon=eps, threshold=self.threshold,
                                                   max_iterations=self.max_iterations, batch_size=batch)
        return {"w1": jnp.full((), jnp.nan, x.dtype), "w2": jnp.where(converged, w, jnp.nan),
                "unconverged": ~converged}

    @property
    def exact(self) -> bool:
        return False

    def __str__(self):
        return (f"Sinkhorn W2, epsilon = {self.epsilon:g} x tr Cov(reference), threshold {self.threshold:g}, "
                f"max_iterations {self.max_iterations}")


__all__ = ["AbstractStudyDistance", "ExactCircle", "ExactLine", "SinkhornDistance"]
