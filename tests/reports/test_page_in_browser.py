"""The rendered report as a person sees it: headless Chromium lays out ``index.html`` at 1400 px; no table may be wider
than the page, the page may not scroll sideways, its height stays within a bound, and every figure is embedded.

Needs Debian's ``chromium`` (``make test`` installs it as root through tests/reports/chromium.sh); skipped without it.
"""

import struct

import pytest

from deltamatch.reports.cli import main

from browser import WIDTH, chromium, measure, screenshot
from test_figures_render import RECORDED

pytestmark = pytest.mark.skipif(chromium() is None, reason="needs chromium (tests/reports/chromium.sh install)")

# The synthetic results folder renders every section (3 methods x 2 seeds, a variant, probes of 3 layers, sweep,
# kernel with the recorded Hopper numbers); folded long tables keep it short. The bound has room for growth, not for
# a table unfolded into thousands of pixels (the page was ≈ 55,000 px tall before the kernel table became a link; 16,056
# once the FA3-class baseline's claim rows joined, one a measured shape).
MAX_HEIGHT = 18000


def test_report_page_fits_the_window(synthetic, tmp_path):
    root = synthetic["root"]
    assert main(["all", "--results", str(root), "--scale-of", "tiny=1.67B", "--recorded", str(RECORDED)]) == 0
    index = root / "report" / "index.html"
    found = measure(index, WIDTH)
    assert found["tables"], "the page has no tables"
    too_wide = [t for t in found["tables"]
                if t["right"] > found["viewport_width"] + 1 or t["scroll_width"] > t["client_width"] + 1]
    assert not too_wide, f"tables wider than the page: {too_wide}"
    assert found["page_width"] <= found["viewport_width"], "the page scrolls sideways"
    assert 2000 < found["page_height"] <= MAX_HEIGHT, found["page_height"]
    assert found["images"] and all(im["ok"] and im["w"] > 100 for im in found["images"])  # embedded, decoded
    shot = screenshot(index, tmp_path / "page.png", WIDTH, 1600)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">I", data[16:20])[0] == WIDTH
