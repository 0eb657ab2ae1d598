"""A study's per-n program kept between processes (convergence/runner.py, issue 36 item 5): written
once inside ``tp.runs.kept_programs``, loaded by a later process, the same bits both times and the
numbers of the plain jitted runner."""

import jax
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import convergence as cv
from transformer_pde.runs import programs


def _study():
    X = tp.uniform_sphere(jax.random.key(5), 12, 3)
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0))
    return cv.convergence_study(dyn, lambda key, n: X[:n], [6], n_ref=12, t1=0.4, dt0=0.2, ts=[0.0, 0.4],
                                seeds=[0, 1], w2_max_n=0).errors


@pytest.mark.slow
def test_a_later_process_loads_the_study_program(tmp_path, monkeypatch):
    store = tmp_path / "programs"
    monkeypatch.setattr(programs, "program_dir", lambda: store)
    monkeypatch.setattr(programs, "_CALLS", {})
    monkeypatch.setattr(programs, "_BY_KEY", {})
    plain = _study()
    with tp.runs.kept_programs():
        first = _study()
        kept = [p.name for p in store.glob("_run-*.jaxcall")]
        assert len(kept) == 1 and kept[0].endswith(".jaxcall")
        programs._CALLS.clear()  # a later process: none of this one's programs, the files stay
        programs._BY_KEY.clear()
        second = _study()
    assert [p.name for p in store.glob("_run-*.jaxcall")] == kept
    for k in plain:
        np.testing.assert_array_equal(first[k], second[k])
        np.testing.assert_allclose(first[k], plain[k], rtol=1e-12, atol=1e-14)
