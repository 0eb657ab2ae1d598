"""The fast kernel's platforms (issue 24, item 2): found without importing jax-finufft; where the
NUFFT does not run, ``Auto`` (and the automatic default) take the exact kernel and ``Fast``
raises naming what to install. Forced on CPU by a platform value and by patching the probe."""

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jax_finufft")

import transformer_pde as tp  # noqa: E402
from transformer_pde.kernels import Auto, Fast, platforms  # noqa: E402


def test_the_probe_finds_the_cpu_build():
    assert "cpu" in platforms.fast_platforms()
    assert platforms.current_platform() == "cpu"


def test_a_platform_without_the_nufft():
    # this CPU-only install has no GPU kernel: Fast refuses naming the CUDA build, Auto is exact
    with pytest.raises(RuntimeError, match="conda-forge") as err:
        tp.SoftmaxAttention.identity(3, 1.0, backend=Fast(platform="gpu"))
    assert "'gpu'" in str(err.value) and "Exact" in str(err.value)
    with pytest.raises(RuntimeError, match="no jax-finufft build"):
        tp.SoftmaxAttention.identity(3, 1.0, backend=Fast(platform="tpu"))
    auto = tp.SoftmaxAttention.identity(3, 1.0, backend=Auto(platform="gpu"))
    choice = auto.kernel_choice(10**6, 10**6, jnp.float64)
    assert choice.path == "exact" and "does not run on platform 'gpu'" in choice.reason


@pytest.mark.slow
def test_no_nufft_anywhere_forces_the_exact_kernel(monkeypatch):
    monkeypatch.setattr(platforms, "fast_platforms", lambda: frozenset())
    from transformer_pde.kernels import backends

    monkeypatch.setattr(backends, "fast_platforms", lambda: frozenset())
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0))
    choice = dyn.dynamics.kernel_choice(10**6, 10**6, jnp.float64)
    assert choice.path == "exact" and "jax-finufft is not installed" in choice.reason
    assert "does not run on platform 'cpu'" in choice.reason
    with pytest.raises(RuntimeError, match="pip install jax-finufft"):
        tp.SoftmaxAttention.identity(3, 1.0, backend=Fast())
    # and it computes, with the exact kernel, at a size where the fast one would be chosen
    x = tp.uniform_sphere(__import__("jax").random.key(0), 5000, 3)
    v = dyn.velocity(x)
    ref = tp.Sphere(tp.SoftmaxAttention.identity(3, 1.0, backend=tp.kernels.Exact())).velocity(x)
    np.testing.assert_array_equal(v, ref)


def test_the_custom_calls_kept_programs_may_hold_are_jax_finuffts():
    """runs/programs.py allows these calls by name in a kept program: they are the targets the
    installed jax-finufft registers, every one of them."""
    from jax_finufft import jax_finufft_cpu

    assert sorted(platforms.FINUFFT_CUSTOM_CALLS) == sorted(jax_finufft_cpu.registrations())
    assert platforms.register_finufft_calls() is True
