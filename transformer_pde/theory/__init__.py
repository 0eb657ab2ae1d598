"""Closed forms and reduced ODEs: the references the simulations are checked against.

- :mod:`.gaussian`: the Gaussian closure's closed forms (docs: math/gaussian.md).
- :mod:`.lost_in_the_middle`: lost in the middle (Volterra, Bessel profile, the mean field)
  (docs: math/causal.md#lost-in-the-middle).
- :mod:`.causal_clustering`: Rényi parking, the count of metastable centers
  (docs: math/causal.md#metastability-and-renyi-parking).
- :mod:`.long_context`: a fixed query against n uniform keys: the critical scale, the mean-field
  entropy and the Poisson limit (docs: math/attention.md#long-context-critical-temperature).
- :mod:`.equiangular`: the reduced ODE of equiangular starts (docs: math/sphere.md#equiangular-starts).
- :mod:`.interaction_energy`: the interaction energy's extremizers, the n-gon, the four-particle
  stationary state (docs: math/sphere.md#gradient-flows-of-the-interaction-energy).
- :mod:`.metastability`: cap overlaps and the merging time of two clusters
  (docs: math/sphere.md#metastability).
- :mod:`.logistic_overlap`: the logistic law of random-heads overlaps
  (docs: math/random_heads.md#overlaps-and-the-logistic-law).
- :mod:`.noisy_sphere`: noisy SA/USA at the uniform law on S^{d−1}: growth rates, K_#, β_*
  (docs: math/noise.md#phase-transition).
- :mod:`.spectral_selection`: pure-mode equilibria of symmetric attention (QᵀK = V = Vᵀ) and their
  stability (docs: math/sphere.md#spectral-selection).
"""

from . import (
    causal_clustering,
    equiangular,
    gaussian,
    interaction_energy,
    logistic_overlap,
    long_context,
    lost_in_the_middle,
    metastability,
    noisy_sphere,
    spectral_selection,
)

__all__ = ["causal_clustering", "equiangular", "gaussian", "interaction_energy", "logistic_overlap",
           "long_context", "lost_in_the_middle", "metastability", "noisy_sphere", "spectral_selection"]
