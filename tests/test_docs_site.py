"""The documentation site builds (``mkdocs build --strict``) and works in a real browser.

Slow (the build takes ~25 s on 2 cores); skipped with the reason when the ``[docs]`` extra or a
Chromium binary is missing. The browser check is ``docs/check_site.py``: KaTeX has typeset the
formulas of a page with math, and typing ``SoftmaxAttention`` into the search box finds its
reference; its screenshots are written into the built site.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _check_site_module():
    spec = importlib.util.spec_from_file_location("docs_check_site", ROOT / "docs" / "check_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for name in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        if importlib.util.find_spec(name.split(".")[0]) is None:
            pytest.skip(f"the docs extra is not installed ({name} missing): pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site") / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return out


def test_site_builds_with_every_page(site):
    for page in ("index.html", "api/models/index.html", "experiments/index.html", "search/search_index.json"):
        assert (site / page).exists(), page
    # the models are documented where the stub models/__init__.pyi lists them (tp.X re-exports them)
    assert "transformer_pde.models.SoftmaxAttention" in (site / "api/models/index.html").read_text()


def test_site_in_a_browser(site):
    check = _check_site_module()
    if check.find_chromium() is None:
        pytest.skip("no Chromium binary found (apt-get install chromium, or set $CHROMIUM)")
    problems = check.check_site(site)
    assert not problems, "\n".join(problems)
    assert (site / "browser-check-math.png").stat().st_size > 10_000
    assert (site / "browser-check-search.png").stat().st_size > 10_000
