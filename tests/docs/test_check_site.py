"""docs/check_site.py without a working browser: an installed Chromium that cannot start here is a
skipped check (exit 2, said on stderr), never a traceback that fails CI for the machine's sake."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("docs_check_site_cli", ROOT / "docs" / "check_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_browser_that_cannot_start_skips_the_check(tmp_path, capsys):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html></html>")
    broken = tmp_path / "chromium"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    assert _module().main([str(site), "--chromium", str(broken)]) == 2
    assert "did not start its DevTools endpoint" in capsys.readouterr().err


def test_no_browser_at_all_skips_the_check(tmp_path, monkeypatch):
    mod = _module()
    monkeypatch.setattr(mod, "find_chromium", lambda explicit=None: None)
    assert mod.main([str(tmp_path)]) == 2
