import pytest
"""The large-n experiment (issue 13) at its tiny size: the fast kernel drives SA on S² to one
cluster (sphere.md §1, d >= 3), seen in the O(n) statistics it saves."""

import numpy as np
from _runs import tiny_run


@pytest.mark.slow
def test_large_n_tokens_meet_in_one_cluster(tmp_path_factory):
    res, cfg, _ = tiny_run("large-n", tmp_path_factory)
    assert bool(res["fast_kernel"])  # the run took the NUFFT path it was asked for
    overlap, angle = res["overlap"], res["max_angle"]
    # uniform start: |x̄|² ~ 1/n and some token nearly antipodal to the mean
    assert overlap[0] < 10.0 / cfg.n and angle[0] > 2.5
    # the end: every token within a small angle of the mean direction, |x̄|² = 1 to 1e-5
    assert 1 - overlap[-1] < 1e-5 and angle[-1] < 0.01
    assert res["sample_clusters"][0] > 100 and res["sample_clusters"][-1] == 1
    assert np.all(np.isfinite(overlap))
