import pytest
"""Smoke test of the benchmark script at tiny n (speed is measured only in benchmarks/)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_kernels.py"


@pytest.mark.slow
def test_benchmark_script_tiny(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    ours = [r for r in rows if r["lib"] == "transformer_pde"]
    assert [r["n"] for r in ours] == [256, 512]
    for r in ours:
        assert r["pairs_per_s"] > 0 and r["seconds"] > 0 and r["xla_bytes"] > 0
    # peers run when installed and are recorded as skipped (with the reason) when not
    for lib, module in (("torch_sdpa", "torch"),):
        got = [r for r in rows if r["lib"] == lib]
        assert len(got) == 2
        installed = importlib.util.find_spec(module) is not None
        assert all(("skipped" in r) != installed for r in got), got
    for lib in ("naive_jax", "jax_nn"):
        assert all(r["pairs_per_s"] > 0 for r in rows if r["lib"] == lib)
    assert result["solve"]["steps"] == 5 and result["solve"]["kernel_seconds"] > 0
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    assert "| 512 |" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_default_velocity_script_tiny():
    """benchmarks/default_velocity.py at small n: the automatic kernel's velocity agrees with plain
    NumPy rows (its own check, reported) and n = 256 takes the exact kernel."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "default_velocity.py"), "--n", "2048",
                           "--repeats", "1", "--sample", "10"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["max_error_vs_numpy"] < 1e-9 and report["rows_checked"] == 10
    assert report["fast_kernel_at_256"] is False
    assert report["dtype"] == "float64" and len(report["later_calls_s"]) == 1


@pytest.mark.slow
def test_warm_runs_script_tiny():
    """benchmarks/warm_runs.py: the later runs of a command in one process compile nothing (what
    makes import + a later run the floor under any compile cache), and it refuses its own --out."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    script = str(ROOT / "benchmarks" / "warm_runs.py")
    command = ["--", "run", "phase-diagram", "--batch", "8", "--num-betas", "2", "--num-saves", "3", "--t1", "1"]
    proc = subprocess.run([sys.executable, script, "--repeats", "1", *command],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["compilations_per_run"][0] >= 1 and report["compilations_per_run"][1:] == [0]
    assert report["import_s"] > 0 and len(report["later_runs_s"]) == 1
    bad = subprocess.run([sys.executable, script, *command, "--out", "x"], capture_output=True, text=True,
                         timeout=60, env=env, check=False)
    assert bad.returncode == 2 and "--out is set per run" in bad.stderr


@pytest.mark.slow
def test_compiler_options_script_tiny():
    """benchmarks/compiler_options.py at tiny size: every program at every level, timed, and in
    float32 the outputs equal the default level's (phase_diagram.CPU_COMPILER_OPTIONS' claim)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compiler_options.py"), "--tiny",
                           "--repeats", "1", "--levels", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    programs = {k: v for k, v in report.items() if isinstance(v, dict)}
    assert len(programs) == 2 and report["dtype"] == "float32"
    for rows in programs.values():
        assert set(rows) == {"default", "level 1"}
        assert all(r["compile_s"] > 0 and r["run_s"] > 0 and r["bitwise_same_as_default"] for r in rows.values())
