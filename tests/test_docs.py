"""Docs that cannot rot: every listing of the rules is generated (the reference, README's table, the rules of
each step in docs/method.md), no prose quotes how many rules there are, every rule documents itself."""

from __future__ import annotations

import re

from conftest import REPO

from tracediag.docs import REQUIRED_SECTIONS, generated_files
from tracediag.engine import load_rules

RULE_COUNT = re.compile(r"\b\d+ (?:of \d+ )?(?:rules|rule modules)\b")  # "36 rules", "6 of 36 rules ran"


def test_generated_listings_are_current():
    for path, text in generated_files(REPO).items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run python -m tracediag.docs --write"


def test_no_prose_quotes_a_rule_count():
    """A count of the rules goes stale with the next rule: the docs say N (or "every rule") instead."""
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            assert not RULE_COUNT.search(line), f"{page.relative_to(REPO)}:{n} quotes a rule count: {line.strip()}"


def test_every_rule_has_docstring_sections_and_metadata():
    for mod in load_rules():
        doc = mod.__doc__ or ""
        assert doc.startswith(f"{mod.RULE.id} "), mod.__name__
        for section in REQUIRED_SECTIONS:
            assert section in doc, f"{mod.__name__} lacks {section}"
        assert mod.__name__.rsplit(".", 1)[1].startswith(mod.RULE.id.lower() + "_")
        assert 1 <= mod.RULE.step <= 6 and callable(mod.check)


def test_readme_documents_every_command_and_output():
    readme = (REPO / "README.md").read_text()
    for needle in (
        "tracediag analyze",
        "findings.json",
        "report.html",
        "trace.duckdb",
        "tracediag/findings-v1",
        "--model",
        "--tp",
        "--out",
        ".ci/run",
    ):
        assert needle in readme, needle


def test_readme_documents_every_command():
    from tracediag.cli.commands import COMMAND_MODULES

    readme = (REPO / "README.md").read_text()
    for module in COMMAND_MODULES:
        command = module.rsplit(".", 1)[1]
        assert f"tracediag {command}" in readme, f"README does not show `tracediag {command}`"


def test_readme_shows_mcp_registration_and_docs_say_how_runs_are_compared():
    readme = (REPO / "README.md").read_text()
    needles = ("claude mcp add tracediag -- tracediag mcp", "claude_desktop_config.json", ".vscode/mcp.json",
               ".cursor/mcp.json", "pip install '.[mcp]'", "--force-compare", "`4` inconclusive")  # fmt: skip
    for needle in needles:
        assert needle in readme, needle
    method = (REPO / "docs" / "method.md").read_text()
    assert "## Comparing two runs" in method
    from tracediag.diff import comparability

    for threshold in (f"{comparability.PHASE_MIX_POINTS * 100:.0f} points", f"{comparability.T_RATIO:g}×",
                      f"{comparability.RATE_REL * 100:.0f} %"):  # fmt: skip
        assert threshold in method, threshold  # the thresholds the code uses are the ones the method states


def test_the_agent_skill_file_names_tables_and_columns_the_store_has():
    """docs/agents/tracediag-skill.md's table of "which table for what": every table and column it names exists."""
    import re

    from tracediag.store import column_docs

    skill = (REPO / "docs" / "agents" / "tracediag-skill.md").read_text()
    assert (
        skill.startswith("---\nname: tracediag\ndescription: ")
        and "docs/agents/tracediag-skill.md" in (REPO / "README.md").read_text()
    )
    docs = column_docs()
    section = skill.split("## Which table for what", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2:4] for line in section.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 10
    for tables, columns in rows:
        names = re.findall(r"`(\w+)`", tables)
        assert names and all(t in docs for t in names), tables
        for part in columns.split(" / "):  # one column list per table, in the order the tables are named
            for col in re.findall(r"\w+", part.replace("`", "")):
                assert any(col in docs[t] for t in names), (tables, col)


def test_extending_md_names_every_extension_point_and_readme_links_it():
    page = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    assert "docs/extending.md" in (REPO / "README.md").read_text(encoding="utf-8")
    points = ("## A rule", "## A derivation", "## An ingester", "## A kernel family", "## A GPU", "## A report section")
    for needle in (*points, "tracediag.testing import run_cases", "python -m tracediag.docs --write"):
        assert needle in page, needle
    for path in re.findall(r"`((?:tracediag|tests)/[\w/.]+\.(?:py|json|sql))`", page):
        assert (REPO / path).exists(), path  # every fixed path it names is there
