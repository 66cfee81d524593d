"""Each demo page's settings (the URL parameters it accepts, demos/NAME/index.html) are the
settings its script reads (DEFAULTS of demos/NAME/main.py): a setting only one side knows
is either unreachable from the page or rejected by it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMOS = sorted(p.parent.name for p in ROOT.glob("demos/*/index.html")
               if "new Demo(" in p.read_text())
COMMON_IMPORT = re.compile(r'from "\.\./common/(\w+\.js)"')


def script_settings(name: str) -> set[str]:
    sys.path.insert(0, str(ROOT / "demos" / "common"))
    try:
        spec = importlib.util.spec_from_file_location(f"settings_{name}",
                                                      ROOT / "demos" / name / "main.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "demos" / "common"))
    return set(mod.D.defaults)


def page_settings(name: str) -> set[str]:
    """The keys of the `defaults: {...}` of the page's Demo description: in its index.html,
    or in a demos/common module it imports the description from (char_lm.js)."""
    html = (ROOT / "demos" / name / "index.html").read_text()
    found = re.findall(r"defaults:\s*\{([^}]*)\}", html) or [
        m for module in COMMON_IMPORT.findall(html)
        for m in re.findall(r"^\s+defaults:\s*\{([^}]*)\}",
                            (ROOT / "demos" / "common" / module).read_text(), re.MULTILINE)]
    assert len(found) == 1, f"{name}/index.html: {len(found)} `defaults: {{...}}` (want one)"
    return set(re.findall(r"(\w+)\s*:", found[0]))


def test_every_demo_page_is_checked() -> None:
    assert len(DEMOS) >= 12, DEMOS


@pytest.mark.parametrize("name", DEMOS)
def test_page_and_script_share_settings(name: str) -> None:
    assert page_settings(name) == script_settings(name)
