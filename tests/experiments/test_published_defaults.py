"""Published defaults reproduce the publication (issue 25 cause 8)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.experiments import equiangular, metastability, normalization


@pytest.mark.slow
def test_metastability_default_merge_reproduces_the_published_collapse():
    """The authors' merge radius 1e-3: collapse at τ ≈ 0.12 for β = 500 (sphere.md §10.3); the
    theorem's radius 1/sqrt(β log β) gives 0.114."""
    cfg = metastability.MetastabilityConfig(stair_betas=(500.0,))
    taus, phi, _, _ = metastability.staircase(cfg)
    assert metastability.collapse_times(taus, phi)[0] == pytest.approx(0.12, abs=0.005)


def test_ngpt_default_alpha_is_the_authors_layer():
    """αh/(1 − αh) = 0.2h at the default: their 200 layers of h = 0.1 end at our t = 20."""
    cfg = normalization.NormalizationConfig()
    ah = cfg.ngpt_alpha * cfg.step
    assert ah / (1 - ah) == pytest.approx(0.2 * cfg.step, rel=1e-12)
    assert normalization.simuformer_depth("ngpt", cfg) == pytest.approx(20.0, rel=1e-12)


@pytest.mark.slow
def test_equiangular_runs_sa_alone(tmp_path):
    cfg = equiangular.EquiangularConfig(**{**equiangular_tiny(), "betas": (1.0,), "models": ("SA",)})
    res = equiangular.compute(cfg)
    assert "rho_SA" in res and "rho_USA" not in res
    # SA's late decay rate of 1 − ρ is 2 (GLPR, orthogonal start)
    assert np.all(np.abs(np.asarray(res["rate_SA"]) - 2.0) < 0.05)
    assert [p.name for p in equiangular.figures(res, cfg, tmp_path)] == ["equiangular.png"]


def equiangular_tiny():
    from transformer_pde.experiments import REGISTRY

    return dict(REGISTRY["equiangular"].tiny)
