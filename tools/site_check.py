"""Look at the built docs site in a real browser, at a desktop and a phone width, and list what a reader would
see wrong: a page wider than the window, a code block cut off instead of scrolling, a word or identifier
cut across lines in a table (elsewhere than after a hyphen, a dash or a slash), a table whose columns scroll out
of view at desktop width, a figure shrunk to unreadable, and the team's internal wording on a page users read
(:data:`INTERNAL_WORDING`; the lab notebook, ``notes/``, is the team's own).

Needs Chromium and Playwright's Python client (``apt-get install chromium``, ``pip install playwright``;
Playwright's own browser download is not needed)::

    mkdocs build -d site && python -m tools.site_check site [--screenshots shots]

Exits 1 when it finds a defect, printing one line per defect (page, width, what, where).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

WIDTHS = {"desktop": 1280, "narrow": 390}
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
# a figure shown below this share of its own width at desktop width is too small to read (its labels,
# 7-9 pt at 110 dpi, fall under about 7 px)
MIN_FIGURE_SCALE = 0.75
LAB_NOTEBOOK = "notes/"
# How the team speaks of its own work, which a user reading the docs does not share: the words it keeps off the
# pages users read (case-insensitive, whole words). Add a phrase when a review finds one.
INTERNAL_WORDING = ("lent", "these machines", "this machine's disk", "the issue's", "this session", "this stop",
                    "so far in this", "the team")

# Runs in the page: every defect as [what, where].
FIND_DEFECTS = """
(minFigureScale) => {
  const found = [];
  const where = (el) => (el.textContent || el.getAttribute('src') || el.tagName).trim().slice(0, 60);
  const page = document.documentElement;
  if (page.scrollWidth > window.innerWidth + 1) {
    found.push(['page wider than the window', `${page.scrollWidth}px in ${window.innerWidth}px`]);
  }
  for (const pre of document.querySelectorAll('.md-content pre')) {
    const box = pre.querySelector('code') || pre;
    const overflowX = getComputedStyle(box).overflowX;
    if (box.scrollWidth > box.clientWidth + 1 && !['auto', 'scroll'].includes(overflowX)) {
      found.push(['code block cut off', where(pre)]);
    }
  }
  for (const cell of document.querySelectorAll('.md-content td, .md-content th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const whole = document.createRange();
      whole.selectNodeContents(node);
      if (new Set([...whole.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top))).size < 2) {
        continue;  // on one line: no word of it is cut
      }
      const text = node.textContent;
      for (const match of text.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (lines.size < 2) continue;
        // where it breaks: after a hyphen, a dash, a slash or an equals sign is how a browser wraps; anywhere else
        // the word is cut (`classic_co` / `ntrol`)
        const top = (i) => { const c = document.createRange(); c.setStart(node, i); c.setEnd(node, i + 1);
                             const r = c.getClientRects()[0]; return r ? Math.round(r.top) : null; };
        const first = top(match.index);
        for (let i = match.index + 1; i < match.index + match[0].length; i++) {
          const t = top(i);
          if (t !== null && t !== first) {
            if (!'-\u2013\u2014/='.includes(text[i - 1])) {
              found.push(['word cut across lines in a table', `${text.slice(match.index, i)}|${text.slice(i, match.index + match[0].length)}`]);
            }
            break;
          }
        }
      }
    }
  }
  if (window.innerWidth >= 1000) {
    // at desktop width every column of a table is in view: a scrolling table hides its right-hand columns
    for (const table of document.querySelectorAll('.md-content table')) {
      const box = table.closest('.md-typeset__scrollwrap') || table.parentElement;
      if (table.scrollWidth > box.clientWidth + 1) {
        const head = [...table.querySelectorAll('th')].map(th => th.textContent.trim()).join(' | ');
        found.push(['table columns out of view', `${table.scrollWidth}px in ${box.clientWidth}px: ${head.slice(0, 80)}`]);
      }
    }
    for (const img of document.querySelectorAll('.md-content img')) {
      if (img.naturalWidth > 0 && img.clientWidth / img.naturalWidth < minFigureScale && img.naturalWidth > 600) {
        found.push(['figure shrunk to ' + Math.round(100 * img.clientWidth / img.naturalWidth) + '%', where(img)]);
      }
    }
  }
  return found;
}
"""


@contextmanager
def serving(site: Path) -> Iterator[str]:
    """The site on a local port, for as long as the block runs."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def pages(site: Path) -> list[str]:
    """Every page of the site, as its path from the root (``sb3/``)."""
    return sorted(str(p.parent.relative_to(site)) + "/" if p.parent != site else ""
                  for p in site.rglob("index.html") if "assets" not in p.parts and "search" not in p.parts)


def internal_wording(text: str) -> list[str]:
    """Each phrase of :data:`INTERNAL_WORDING` in ``text``, with the words around it.

    Examples:
        >>> internal_wording("Measured on the GPU we were lent. Lentils are fine.")
        ['...GPU we were lent. Lentils are...']
    """
    import re

    found = []
    for phrase in INTERNAL_WORDING:
        around = rf"(?:\S+\s+){{0,3}}\b{re.escape(phrase)}\b\S*(?:\s+\S+){{0,2}}"
        found += [f"...{' '.join(match.group().split())}..." for match in re.finditer(around, text, re.IGNORECASE)]
    return found


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def check(site: Path, screenshots: Path | None = None) -> list[str]:
    """One line per defect found on any page at any width."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    if executable is None:
        raise RuntimeError("no Chromium found: apt-get install chromium")
    defects = []
    with serving(site) as root, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        for label, width in WIDTHS.items():
            context = browser.new_context(viewport={"width": width, "height": 900})
            # the site's own files only: a request to another host (the theme's web fonts) waits on a network the
            # check may not have, and the page falls back to local fonts either way
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(root)
                          else route.abort())
            page = context.new_page()
            for path in pages(site):
                page.goto(f"{root}/{path}", wait_until="load")
                if label == "desktop" and not path.startswith(LAB_NOTEBOOK):
                    defects += [f"{path or '/'} [{label}] internal wording: {found}"
                                for found in internal_wording(page.inner_text("body"))]
                for what, where in page.evaluate(FIND_DEFECTS, MIN_FIGURE_SCALE):
                    if what == "table columns out of view" and path.startswith(LAB_NOTEBOOK):
                        continue  # the lab notebook's dated tables, for contributors, may scroll
                    defects.append(f"{path or '/'} [{label}] {what}: {where}")
                if screenshots is not None:
                    screenshots.mkdir(parents=True, exist_ok=True)
                    name = (path.strip("/").replace("/", "-") or "home") + f"-{label}.png"
                    page.screenshot(path=str(screenshots / name), full_page=True)
            context.close()
        browser.close()
    return defects


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("site", type=Path, help="the built site (mkdocs build -d SITE)")
    parser.add_argument("--screenshots", type=Path, default=None, help="also save a full-page screenshot per page")
    args = parser.parse_args(argv)
    defects = check(args.site, args.screenshots)
    print("\n".join(defects) if defects else f"no defects on {len(pages(args.site))} pages at {', '.join(WIDTHS)} widths")
    return 1 if defects else 0


if __name__ == "__main__":
    raise SystemExit(main())
