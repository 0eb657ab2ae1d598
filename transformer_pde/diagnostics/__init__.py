"""Pure functions of a state: clusters, energies, moments, distances (usable in ``stats=``)."""

from .clusters import cluster_count, cluster_labels, cluster_masses, clustered_pair_fraction
from .energy import (
    attention_matrix,
    energy_rate,
    interaction_energy,
    log_interaction_energy,
    mean_token,
    normalized_energy,
    numerical_rank,
)

__all__ = [
    "attention_matrix",
    "cluster_count",
    "cluster_labels",
    "cluster_masses",
    "clustered_pair_fraction",
    "energy_rate",
    "interaction_energy",
    "log_interaction_energy",
    "mean_token",
    "normalized_energy",
    "numerical_rank",
]
