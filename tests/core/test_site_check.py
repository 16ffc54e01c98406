"""The docs site as a reader sees it, in headless Chromium (``tools.site_check``): the check finds each kind of
defect on a page made to show it, and the built site shows none at desktop and narrow widths.

Needs Chromium and Playwright's Python client (``apt-get install chromium``; ``playwright`` is in the ``dev``
extra): ``.ci/run`` installs both, and says so where Chromium cannot be installed (then these skip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import site_check

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.needs("playwright"),
              pytest.mark.skipif(site_check.chromium() is None, reason="needs Chromium (apt-get install chromium)")]

PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width"><style>
body {{ margin: 0; font: 16px sans-serif; }} .md-content {{ width: 300px; }}
pre code {{ display: block; overflow-x: {overflow}; }} td {{ overflow-wrap: {wrap}; }}
</style></head><body><div class="md-content">
<pre><code>a line of code longer than the column it sits in, by a long way, on any screen</code></pre>
<table><tr><td style="width: 40px">classic_control</td><td>a wide cell</td></tr></table>
<div style="width: {page}px">content</div>
</div></body></html>"""


def site_with(tmp_path: Path, **style) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE.format(**style))
    return site


def test_the_check_finds_a_cut_code_block_a_cut_word_and_a_page_wider_than_the_window(tmp_path):
    defects = site_check.check(site_with(tmp_path, overflow="hidden", wrap="anywhere", page=2000))
    for what in ("code block cut off", "word cut across lines in a table: cl", "page wider than the window"):
        assert any(what in line for line in defects), (what, defects)


def test_the_check_passes_a_page_that_scrolls_its_code_and_keeps_its_words(tmp_path):
    defects = site_check.check(site_with(tmp_path, overflow="auto", wrap="normal", page=100))
    assert defects == []


def test_the_check_finds_a_table_whose_columns_scroll_out_of_view_at_desktop_width(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    header = "".join(f'<th style="white-space: nowrap">column number {i}</th>' for i in range(20))
    (site / "index.html").write_text(
        '<!doctype html><html><body><div class="md-content"><div class="md-typeset__scrollwrap" '
        f'style="overflow-x: auto; width: 700px"><table><tr>{header}</tr></table></div></div></body></html>')
    defects = site_check.check(site)
    assert [d for d in defects if "table columns out of view" in d and "[desktop]" in d], defects


def test_the_check_finds_a_shrunk_figure_and_the_teams_internal_wording_but_not_in_the_lab_notebook(tmp_path):
    from PIL import Image

    site = tmp_path / "site"
    (site / "notes").mkdir(parents=True)
    Image.new("RGB", (1200, 400), "white").save(site / "plot.png")
    body = ('<div class="md-content" style="width: 700px"><p>Measured on the GPU we were lent.</p>'
            '<img src="/plot.png" style="max-width: 100%"></div>')
    (site / "index.html").write_text(f"<!doctype html><html><body>{body}</body></html>")
    (site / "notes" / "index.html").write_text('<!doctype html><html><body><p>The machine we were lent.</p></body></html>')
    defects = site_check.check(site)
    assert any(d.startswith("/ [desktop] figure shrunk to 58%") for d in defects), defects
    assert any(d.startswith("/ [desktop] internal wording: ...GPU we were lent.") for d in defects), defects
    assert not [d for d in defects if d.startswith("notes/")], defects


@pytest.mark.needs("mkdocs")
def test_the_built_site_shows_no_defect_a_reader_sees(built_site):
    assert site_check.check(built_site) == []
