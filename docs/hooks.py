"""The docs build hook: pages write ``<!-- generated: NAME -->`` where a reference part goes, and this
hook puts in the text ``tools/reference.py`` (or the results index) generates from the code,
so a page never copies a default, a preset or a flag by hand."""

from __future__ import annotations

import re
import sys
from pathlib import Path

GENERATED = re.compile(r"<!-- generated: ([a-z0-9-]+) -->")


def _generate(name: str) -> str:
    # the `mkdocs` command puts no folder on the import path (`python -m mkdocs` puts the current one), and
    # restores the path after loading this hook: the repository's `tools` package is found from here
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tools import reference

    makers = {"config": reference.config_markdown, "presets": reference.presets_markdown,
              "cli": reference.cli_markdown, "verified": reference.verified_markdown,
              "api": reference.api_markdown, "problems": reference.problems_markdown,
              "install": reference.install_markdown, "platform": reference.platform_markdown, "support-sb3": reference.support_markdown,
              "support-tianshou": lambda: reference.support_markdown("rlaccel_tianshou"),
              "examples": reference.examples_markdown, "examples-code": reference.examples_code_markdown,
              "algorithms": reference.algorithms_markdown}
    if name not in makers:
        raise ValueError(f"docs: no generator named {name!r}; known: {sorted(makers)}")
    return makers[name]()


# the code's docstrings cross-reference as Sphinx does (:class:`X`), which mkdocstrings renders as the role's
# name then the code: the role is dropped, and a dotted path keeps its last name (the member itself)
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|mod|attr|exc|obj):<code>~?(?:[\w.]*\.)?([\w]+(?:\(\))?)</code>")


def on_page_markdown(markdown: str, **kwargs) -> str:
    return GENERATED.sub(lambda m: _generate(m.group(1)), markdown)


def on_page_content(html: str, **kwargs) -> str:
    return SPHINX_ROLE.sub(lambda m: f"<code>{m.group(1)}</code>", html)
