"""Closed forms and reduced ODEs: the references the simulations are checked against.

- :mod:`.gaussian`: the Gaussian closure's closed forms (euclidean.md §4–5).
- :mod:`.causal`: lost in the middle (Volterra, Bessel profile, Rényi parking, the LitM mean
  field) (sphere.md §4).
- :mod:`.equiangular`: the reduced ODE of equiangular starts (sphere.md §1).
- :mod:`.random_heads`: the logistic overlap law (sphere.md §5).
"""

from . import causal, equiangular, gaussian, random_heads

__all__ = ["causal", "equiangular", "gaussian", "random_heads"]
