"""``benchmarks/gpu.py --dry-run``: the GPU benchmark's every section runs on CPU at tiny size,
in-process, and writes its markdown table (the numbers are measured only on a GPU)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("jax_finufft")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_benchmark_dry_run(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    out = tmp_path / "gpu.md"
    assert gpu.main(["--dry-run", "--out", str(out)]) == 0
    text = out.read_text()
    for section in ("| device | platform | cpu |", "| exact d=3 | transformer_pde Exact, n=64 |",
                    "| exact d=64 | jax.nn.dot_product_attention, n=64 |", "| blocks d=3",
                    "| fast | Fast(tol=1e-08), n=500, float64 |", "| large-n | n=64",
                    "peak memory", "| total | wall time"):
        assert section in text, section
    assert "pairs/s" in text and "failed" not in text
