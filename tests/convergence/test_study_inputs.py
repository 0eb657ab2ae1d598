"""convergence_study's inputs named at its own layer (issue 25 cause 6): distinct seeds, a
reference larger than every n, integer sizes (a NaN size is named, not "cannot convert"); the
measurement times, the dtype and the Sinkhorn cut-off (issue 37)."""

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
    (dict(ns=[4, 8], ts=[]), r"ts must be a non-empty 1-D sequence"),
    (dict(ns=[4, 8], ts=[0.0, float("nan")]), r"ts must be finite"),
    (dict(ns=[4, 8], ts="abc"), r"ts must be a 1-D sequence of times"),
    (dict(ns=[4, 8], dtype="int32"), r"dtype must be a floating dtype"),
    (dict(ns=[4, 8], dtype="not a dtype"), r"dtype must be a floating dtype"),
    (dict(ns=[4, 8], w2_max_n=-1), r"w2_max_n must be >= 0"),
    (dict(ns=[4, 8], w2_max_n=None), r"w2_max_n must be an integer"),
])
def test_convergence_study_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tp.convergence.convergence_study(ATTN, LAW, t1=0.1, dt0=0.05, **kwargs)


@pytest.mark.package_errors
def test_float64_without_x64_is_named():
    import jax

    with jax.enable_x64(False):
        with pytest.raises(ValueError, match="dtype=float64 needs jax_enable_x64"):
            tp.convergence.convergence_study(ATTN, LAW, [4, 8], t1=0.1, dt0=0.05, dtype="float64")
