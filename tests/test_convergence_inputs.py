"""convergence_study's inputs named at its own layer (issue 25 cause 6): distinct seeds, a
reference larger than every n, integer sizes (a NaN size is named, not "cannot convert")."""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp

ATTN = tp.SoftmaxAttention.identity(2, 1.0)
LAW = tp.Gaussian(np.zeros(2), np.eye(2))


@pytest.mark.package_errors
@pytest.mark.parametrize("kwargs, message", [
    (dict(ns=[4, 8], seeds=(0, 1, 1)), r"seeds must be distinct .*\[1\]"),
    (dict(ns=[4, 8], n_ref=6), r"n_ref=6 must be at least the largest n=8"),
    (dict(ns=[4, float("nan")]), r"ns\[1\] must be an integer, got nan"),
    (dict(ns=[4, 8.5]), r"ns\[1\] must be an integer, got 8.5"),
])
def test_convergence_study_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tp.convergence.convergence_study(ATTN, LAW, t1=0.1, dt0=0.05, **kwargs)
