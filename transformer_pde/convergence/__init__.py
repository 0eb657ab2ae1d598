r"""Mean-field convergence rates: how fast n-particle systems approach the Transformer PDE.

The particle system dx_i/dt = Γ_{μ^n_t}(x_i) with x_i(0) i.i.d. μ_0 has empirical measure
μ^n_t = (1/n) Σ_i δ_{x_i(t)}, a weak solution of the Transformer PDE
(docs: math/mean_field.md#mean-field-convergence). Its distance to the mean-field solution μ_t is measured at chosen
times, for n over a geometric range and several seeds, and the rate is fitted on a log-log scale.

**Two sources of error, separated by a same-seed coupling** (the Sznitman construction). With
the same initial samples, also move *tracers* z_i along the characteristics of the mean-field
field: dz_i/dt = Γ_{μ_t}(z_i), z_i(0) = x_i(0). The z_i(t) are i.i.d. samples of μ_t, so

    d(μ^n_t, μ_t)  <=  W_2(μ^n_t, ν^n_t)  +  d(ν^n_t, μ_t),     ν^n_t = (1/n) Σ_i δ_{z_i(t)},
                       └ dynamics-added ┘    └ sampling error carried by the exact flow ┘

and W_2(μ^n_t, ν^n_t) <= ((1/n) Σ_i |x_i(t) − z_i(t)|²)^{1/2} =: coupling error, zero at t = 0.
For a Lipschitz field (compact support, docs: math/mean_field.md#mean-field-convergence) propagation of chaos gives
a coupling error O(n^{-1/2}) on bounded time intervals; moment errors follow the Monte Carlo rate
n^{-1/2}; W_2 between an empirical measure and its law decays like n^{-1/d} for d >= 3 (and
(log n / n)^{1/2} for d = 2).

**Mean-field references** (values; each law owns its own, :meth:`AbstractLaw.reference`).
* Gaussian data with a Gaussian closure (docs: math/gaussian.md#moment-equations): μ_t = N(α(t), Σ(t)) from the
  moment ODEs, and the characteristics are affine, dz/dt = J(t) z + c(t), with (J, c) the affine field
  of the closure (:func:`gaussian_affine_field`; :class:`GaussianLaw`, :class:`GaussianClosureReference`).
* A law whose mean field vanishes, Γ_{μ_0} ≡ 0 (:class:`StationaryLaw`; the uniform law on
  S^{d-1} under SA with Q = K = V = I, :func:`uniform_sphere_law`): μ_t = μ_0 and the tracers
  stay where they start, so the reference is exact at every n (no floor): this is what takes the
  study to n = 2²² with the fast kernel (:class:`StationaryReference`).
* A smooth law given by its density (:class:`QuadratureLaw`: :func:`perturbed_circle_law`,
  :func:`vmf_cap_law`, :func:`gaussian_quadrature_law`), any dynamics: a quadrature rule of μ_0
  evolved as weighted tokens (docs: math/mean_field.md#quadrature-references), integrated jointly; the tracers
  follow its field. Its error is the rule's (spectral while the flow map is smooth), estimated in every
  measurement as the change when the rule of the coarser order replaces it
  (:class:`QuadratureReference`; measured: < 1e-6 in the exact W₁ on S¹ at t = 1, β = 9).
* Any other law (:class:`SampledLaw`, a sampler): a large-n reference system x^ref (n_ref
  particles, its own seed) integrated jointly; tracers follow the field of μ^{ref}_t. Its own
  error (n_ref^{-1/2}) is a floor (:class:`ParticleReference`).

One idea per module: :mod:`.laws` (the initial laws, each with its reference), :mod:`.references`
(the mean field compared with), :mod:`.runner` (the one runner over ``tp.Coupled`` states, one
:class:`StudySpec` for all), :mod:`.metrics` (what is measured at a save), :mod:`.study`
(:func:`convergence_study`), :mod:`.rates` (rate tables); the distances are
:mod:`transformer_pde.diagnostics.study_distances`, the rate fits
:func:`transformer_pde.statistics.fit_rate`.

The distances (``metrics``): ``mean`` |x̄ − α|; ``cov`` ‖Ĉ − Σ‖_F; ``bw`` the Bures–Wasserstein
distance between the moment-matched Gaussians; ``coupling`` (above); ``flow_bw`` the ``bw`` of
the tracers (the sampling error alone); ``w1``, ``w2`` transport distances (the study's
:class:`~transformer_pde.diagnostics.AbstractStudyDistance`, chosen by the reference): exact on R (W₁, W₂ from quantile
functions) and on S¹ (W₁ from cumulative functions), no ε; elsewhere ``w2`` = √(Sinkhorn
divergence) with ε relative to tr Cov of the reference measure (ott-jax), NaN and counted when it
does not converge. The compared measure is an independent n-sample of μ_t (closure, stationary),
the reference system, or the quadrature rule (on S¹ and R a finer rule carried by its field).
"""

from ..diagnostics.study_distances import AbstractStudyDistance, ExactCircle, ExactLine, SinkhornDistance
from . import laws, metrics, rates, references, runner, study  # noqa: F401  (the modules, one idea each)
from .laws import *  # noqa: F403  (each module's __all__ is its public part)
from .metrics import METRICS  # noqa: F401  (tp.convergence.METRICS, read by the experiments)
from .rates import *  # noqa: F403
from .references import *  # noqa: F403
from .runner import StudySpec
from .study import *  # noqa: F403

# the study's distances live in diagnostics (re-exported here, where a study chooses them)
__all__ = ["AbstractStudyDistance", "ExactCircle", "ExactLine", "SinkhornDistance", "StudySpec"]
__all__ += laws.__all__
__all__ += rates.__all__
__all__ += references.__all__
__all__ += study.__all__
