"""Closed forms and reduced ODEs: the references the simulations are checked against.

- :mod:`.gaussian`: the Gaussian closure's closed forms (euclidean.md §4–5).
- :mod:`.causal`: lost in the middle (Volterra, Bessel profile, Rényi parking, the LitM mean
  field) (sphere.md §4).
- :mod:`.equiangular`: the reduced ODE of equiangular starts (sphere.md §1).
- :mod:`.logistic_overlap`: the logistic law of random-heads overlaps (sphere.md §5).
- :mod:`.noisy_sphere`: noisy SA/USA at the uniform law on S^{d−1}: growth rates, K_#, β_*
  (sphere.md §12).
"""

from . import causal, equiangular, gaussian, logistic_overlap, noisy_sphere

__all__ = ["causal", "equiangular", "gaussian", "logistic_overlap", "noisy_sphere"]
