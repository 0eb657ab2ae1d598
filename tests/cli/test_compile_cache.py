"""The CLI's persistent compilation cache (issue 24, item 3): where it goes (option, environment
variable, XDG default), how it is turned off, and that a run fills it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_pde.runs.compile_cache import (
    COMPILE_CACHE_ENV,
    default_compile_cache,
    resolve_compile_cache,
)


def test_where_the_cache_goes(monkeypatch, tmp_path):
    monkeypatch.delenv(COMPILE_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_compile_cache() == tmp_path / "xdg" / "transformer_pde" / "jax"
    assert resolve_compile_cache(None) == tmp_path / "xdg" / "transformer_pde" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert resolve_compile_cache(None) == Path.home() / ".cache" / "transformer_pde" / "jax"
    monkeypatch.setenv(COMPILE_CACHE_ENV, str(tmp_path / "env"))
    assert resolve_compile_cache(None) == tmp_path / "env"
    assert resolve_compile_cache(str(tmp_path / "opt")) == tmp_path / "opt"  # the option wins
    assert resolve_compile_cache("off") is None
    monkeypatch.setenv(COMPILE_CACHE_ENV, "off")
    assert resolve_compile_cache(None) is None
    assert resolve_compile_cache(str(tmp_path / "opt")) == tmp_path / "opt"


@pytest.mark.slow
def test_a_run_fills_the_cache(tmp_path):
    """A whole CLI run in a subprocess (15-80 s on the shared 2-core machine)."""
    cache = tmp_path / "cache"
    env = dict(os.environ, **{COMPILE_CACHE_ENV: "off"})  # the option overrides it
    cmd = [sys.executable, "-m", "transformer_pde.cli", "run", "clustering", "--out",
           str(tmp_path / "run"), "--n", "8", "--t1", "1", "--dt", "0.5", "--num-saves", "2",
           "--no-progress", "--compile-cache", str(cache)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert any(cache.iterdir())  # compiled programs were written


_OFF_MEANS_OFF = """
import sys
from pathlib import Path
import jax, jax.numpy as jnp
from transformer_pde.runs import compile_cache, programs

env_dir, mine = Path(sys.argv[1]), Path(sys.argv[2])

def files(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []

def compiled(k):  # a new program each time: a compile the persistent cache would keep
    return jax.jit(lambda x: jnp.sin(x) * k)(jnp.ones(3)).block_until_ready()

compile_cache.enable_compile_cache(compile_cache.resolve_compile_cache("off"))
compiled(1.0)
print(len(files(env_dir)), programs.program_dir())
compile_cache.enable_compile_cache(mine)
compiled(2.0)
filled = files(mine)
compile_cache.enable_compile_cache(None)  # off again after a compile: the next one writes nowhere
compiled(3.0)
print(len(filled) > 0, files(mine) == filled, programs.program_dir())
"""


def test_off_turns_jaxs_own_cache_off_too(tmp_path):
    """``--compile-cache off`` with ``JAX_COMPILATION_CACHE_DIR`` set in the environment (as this test
    suite sets it): JAX's cache was left on there, and the kept programs with it. In a fresh process:
    off writes nothing to the environment's directory, and off after a compile (JAX opens its cache
    once per process) stops the writing too."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "env"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    res = subprocess.run([sys.executable, "-c", _OFF_MEANS_OFF, str(tmp_path / "env"), str(tmp_path / "mine")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["0 None", "True True None"]
