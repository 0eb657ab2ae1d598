"""The krause experiment at its tiny size: Hegselmann–Krause fragmentation against the radius."""

import numpy as np
import pytest
from _runs import tiny_run


@pytest.mark.slow
def test_krause_clusters_against_the_radius(tmp_path_factory):
    res, cfg, _ = tiny_run("krause", tmp_path_factory)
    radii, counts, final = res["radii"], res["clusters"], res["final"]
    assert counts[-1] == 1  # r = 0.5 on [0, 1]: consensus
    assert np.all(np.diff(counts) <= 0) and counts[0] >= 4
    # clusters form about 2r apart: the count is 1/(2r) to within 1.5 at these sizes
    assert np.all(np.abs(counts - 1 / (2 * radii)) <= 1.5)
    # at rest, distinct clusters are farther apart than r (closer ones would still attract)
    for r, xs in zip(radii, final):
        centres = np.unique(np.round(xs, 3))
        assert np.all(np.diff(centres) > r)


@pytest.mark.parametrize("n", [2, 512, 513, 4096])
def test_footprint_names_the_layout_the_model_uses(n):
    """The experiment's footprint (written without JAX, for `list`) states the tiles that
    tp.KrauseAttention's default layout really streams: dense exactly where the layout is."""
    import transformer_pde as tp
    from transformer_pde.experiments.configs.krause import DENSE_PAIRS, TILE

    blocks = tp.KrauseAttention.identity(1).layout.blocks(n, n, 1)
    assert (blocks is None) == (n * n <= DENSE_PAIRS)
    if blocks is not None:
        assert tuple(blocks) == TILE


def test_a_run_that_turns_nonfinite_is_reported_per_radius():
    """The kept program reports a NaN as each radius' time (checks are not in it), which compute
    raises: started from a NaN token, every radius' run is non-finite from t = 0."""
    import jax
    import jax.numpy as jnp

    from transformer_pde.experiments.configs.krause import KrauseConfig
    from transformer_pde.experiments.krause import final_positions
    from transformer_pde.runs import NonFiniteRun, raise_if_nonfinite

    cfg = KrauseConfig(n=5, radii=(0.2, 0.5), t1=1.0, dt=0.25)
    x0 = jnp.linspace(0.0, 1.0, cfg.n)[:, None]
    finals, nonfinite = jax.jit(final_positions, static_argnums=0)(cfg, x0)
    assert np.all(np.isinf(nonfinite)) and np.isfinite(finals).all()
    _, nonfinite = jax.jit(final_positions, static_argnums=0)(cfg, x0.at[2, 0].set(jnp.nan))
    np.testing.assert_array_equal(nonfinite, [0.0, 0.0])
    with pytest.raises(NonFiniteRun, match="radius"):
        raise_if_nonfinite("krause", nonfinite, {"radius": np.asarray(cfg.radii)}, "the step dt is too large")
