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
