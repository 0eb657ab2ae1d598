"""Pure functions of a state: clusters, energies, moments, distances (one Sinkhorn divergence), the
modes of a KDE, the sliced Wasserstein distance on the sphere (:mod:`.sliced`), relative entropy to a target density (:mod:`.entropy`); the distances a convergence
study measures, values it is given (:mod:`.study_distances`); and the a-priori bounds those are
checked against (:mod:`.bounds`).

Usable as statistics inside a solve: ``tp.solve(..., saveat=diffrax.SaveAt(ts=ts, fn=...))``.
"""

from . import bounds, clusters, distances, distances_1d, energy, entropy, kde, moments, sliced, study_distances
from .bounds import *  # noqa: F403  (each module's __all__ is its public part)
from .clusters import *  # noqa: F403
from .distances import *  # noqa: F403
from .distances_1d import *  # noqa: F403
from .energy import *  # noqa: F403
from .entropy import *  # noqa: F403
from .kde import *  # noqa: F403
from .moments import *  # noqa: F403
from .sliced import *  # noqa: F403
from .study_distances import *  # noqa: F403

__all__ = []
__all__ += bounds.__all__
__all__ += clusters.__all__
__all__ += distances.__all__
__all__ += distances_1d.__all__
__all__ += energy.__all__
__all__ += entropy.__all__
__all__ += kde.__all__
__all__ += moments.__all__
__all__ += sliced.__all__
__all__ += study_distances.__all__
