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
