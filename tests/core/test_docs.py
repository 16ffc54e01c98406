"""The docs stay true to the code: every config key and CLI flag is documented (the reference pages
are generated from those docs), the results page and the README's table match the results files, the
README stays short and cites nothing outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlaccel_plugins.config import SECTIONS
from tools import reference

ROOT = Path(__file__).resolve().parents[2]


def test_every_config_key_has_a_docstring_that_the_reference_shows():
    keys = reference.config_keys()
    assert {k.name for k in keys} == {f for cls in SECTIONS.values() for f in cls.__dataclass_fields__}
    assert not [k.name for k in keys if not k.doc], "config keys without a docstring under the field"
    page = reference.config_markdown()
    for key in keys:
        assert f"| `{key.name}` | `{key.default}` |" in page


def test_every_cli_flag_has_help_and_every_command_a_summary():
    commands = reference.cli_commands()
    assert {"rlaccel train", "rlaccel bench", "rlaccel demo", "rlaccel export"} <= {c for c, _, _ in commands}
    undocumented = [f"{command} {flags}" for command, _, parser in commands
                    for flags, text in reference.cli_options(parser) if not text.strip()]
    assert not undocumented, f"flags without help: {undocumented}"
    assert all(summary for _, summary, _ in commands)
    assert "`--seeds`" in reference.cli_markdown()


def test_the_presets_page_lists_every_registered_preset():
    import rlaccel_plugins as rla

    page = reference.presets_markdown()
    assert all(f"| `{name}` |" in page for name in rla.preset_names())


def test_the_results_page_and_the_readme_table_match_the_results_files():
    check = subprocess.run([sys.executable, "-m", "benchmarks.results_index", "--check"], cwd=ROOT,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_readme_is_short_and_nothing_cites_a_file_outside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert readme.index("```diff") < 1500  # the drop-in diff is on the first screen
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    outside = re.compile(r"\b(DESIGN|SEED)\.md\b")
    citing = [p for p in tracked if p.endswith((".py", ".md", ".toml", ".yml", ".yaml"))
              and p != "tests/core/test_docs.py" and outside.search((ROOT / p).read_text(errors="replace"))]
    assert not citing, f"files citing DESIGN.md / SEED.md, which a checkout does not have: {citing}"


@pytest.mark.needs("mkdocs")
def test_the_ci_docs_build_fails_on_a_broken_link(tmp_path):
    """CI builds the site strictly without --quiet (which would stop mkdocs counting warnings); on a copy of
    the docs with one broken link and one broken anchor, that build must fail and name them."""
    command = next(line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "mkdocs build" in line)
    assert "--strict" in command and "--quiet" not in command and " -q" not in command
    import shutil

    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md", "benchmarks", "rlaccel_plugins", "adapters", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\n[a page that is not there](nowhere.md) [an anchor](sb3.md#no-such-heading)\n")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode != 0
    assert "nowhere.md" in build.stderr and "no-such-heading" in build.stderr


@pytest.mark.needs("mkdocs")
def test_the_built_site_shows_no_machine_path_unrendered_role_or_address_it_does_not_control(built_site):
    site = built_site
    # (the team's internal wording is the browser check's: tools.site_check.INTERNAL_WORDING)
    forbidden = re.compile(r"/work/|/root/|/home/\w|/tmp/(?!torchinductor_)|github\.com/rlaccel"
                           r"|:(?:class|meth|func|data|mod|attr):<code>")  # a Sphinx role shown as it is written
    found = {str(page.relative_to(site)): sorted(set(forbidden.findall(page.read_text())))
             for page in site.rglob("*.html") if forbidden.search(page.read_text())}
    assert not found, found


def test_the_readmes_resume_example_names_the_folder_a_run_writes():
    from rlaccel_plugins.cli import default_logdir

    assert f"rlaccel train --resume {default_logdir('sb3', 'dqn', 'CartPole-v1', when='<time>')} " in \
        (ROOT / "README.md").read_text()


def test_the_troubleshooting_page_lists_the_messages_the_code_raises():
    found = reference.problems()
    texts = {p.kind: [q.text for q in found if q.kind == p.kind] for p in found}
    assert len(texts["error"]) > 100 and len(texts["warning"]) >= 4 and len(texts["log"]) >= 8
    assert any(t.startswith("sampling_ratio must sum to 1") for t in texts["error"])
    assert any("torch.compile failed for the compiled update" in t for t in texts["warning"])
    assert "| `rlaccel_plugins.checkpoint` | rlaccel: skipping checkpoint …" in reference.problems_markdown()
    assert "<!-- generated: problems -->" in (ROOT / "docs" / "troubleshooting.md").read_text()


def test_the_readme_support_table_is_the_one_generated_from_the_registries():
    readme = (ROOT / "README.md").read_text()
    assert reference.README_SUPPORT.search(readme), "the README lost its support-table markers"
    assert reference.readme_with_support(readme) == readme, (
        "README.md's support table differs from the registries': run `python -m tools.reference --readme`")


def test_the_lab_notebook_is_out_of_the_user_sidebar_and_linked_from_contributing():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def pages(nav):
        for item in nav:
            for value in (item.values() if isinstance(item, dict) else [item]):
                yield from (pages(value) if isinstance(value, list) else [value])

    shown = list(pages(config["nav"]))
    assert "contributing.md" in shown and not [p for p in shown if p.startswith("notes/")]
    assert "notes/*" in config["not_in_nav"]
    assert "(notes/index.md)" in (ROOT / "docs" / "contributing.md").read_text()
