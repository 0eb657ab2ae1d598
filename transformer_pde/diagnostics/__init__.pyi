"""The public names of :mod:`transformer_pde.diagnostics`, one line each, as each module's ``__all__``
lists them (``tests/diagnostics/test_exports.py`` checks the two agree). At run time
``diagnostics/__init__.py`` reads this stub (``_lazy.attach_stub``) and imports a name's module on first
access (``tp.diagnostics.kde_modes`` loads no model, so no Equinox); static tools read it as the
package's interface."""

from . import bounds as bounds
from . import clusters as clusters
from . import distances as distances
from . import distances_1d as distances_1d
from . import energy as energy
from . import entropy as entropy
from . import kde as kde
from . import line_clusters as line_clusters
from . import moments as moments
from . import sliced as sliced
from . import study_distances as study_distances
from .bounds import lipschitz_rate as lipschitz_rate
from .bounds import stability_bound as stability_bound
from .bounds import support_radius_bound as support_radius_bound
from .bounds import value_norm_integral as value_norm_integral
from .clusters import AbstractClusterMetric as AbstractClusterMetric
from .clusters import Cosine as Cosine
from .clusters import Euclidean as Euclidean
from .clusters import atoms as atoms
from .clusters import cluster_count as cluster_count
from .clusters import cluster_labels as cluster_labels
from .clusters import cluster_masses as cluster_masses
from .clusters import clustered_pair_fraction as clustered_pair_fraction
from .clusters import renyi_centers as renyi_centers
from .distances import bures_wasserstein as bures_wasserstein
from .distances import exact_wasserstein as exact_wasserstein
from .distances import sinkhorn_divergence as sinkhorn_divergence
from .distances import sinkhorn_wasserstein as sinkhorn_wasserstein
from .distances import sinkhorn_wasserstein_status as sinkhorn_wasserstein_status
from .distances import stability_ratio as stability_ratio
from .distances import support_radius as support_radius
from .distances_1d import wasserstein_circle as wasserstein_circle
from .distances_1d import wasserstein_line as wasserstein_line
from .energy import attention_matrix as attention_matrix
from .energy import interaction_energy as interaction_energy
from .energy import log_interaction_energy as log_interaction_energy
from .energy import mean_token as mean_token
from .energy import normalized_energy as normalized_energy
from .energy import numerical_rank as numerical_rank
from .energy import perceptron_energy as perceptron_energy
from .energy import stationarity_residual as stationarity_residual
from .entropy import check_normalized as check_normalized
from .entropy import relative_entropy as relative_entropy
from .kde import kde_critical_points as kde_critical_points
from .kde import kde_modes as kde_modes
from .line_clusters import gap_clusters as gap_clusters
from .moments import empirical_moments as empirical_moments
from .moments import mean_overlap as mean_overlap
from .sliced import random_great_circles as random_great_circles
from .sliced import sliced_wasserstein_sphere as sliced_wasserstein_sphere
from .study_distances import AbstractStudyDistance as AbstractStudyDistance
from .study_distances import ExactCircle as ExactCircle
from .study_distances import ExactLine as ExactLine
from .study_distances import SinkhornDistance as SinkhornDistance
