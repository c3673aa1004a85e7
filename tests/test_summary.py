"""summary.md and the README's generated results block.

The README's results block must be exactly the committed reference summary of the default run
(``tests/expected/default/summary.md``), rendered by ``pipeline.summary.readme_block``: the
README's numbers are generated from a run, never typed.
"""

from pathlib import Path

import pytest

from endoexplain_core.pipeline import summary

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "expected" / "default" / "summary.md"


def test_readme_results_block_is_the_reference_default_summary():
    readme = (ROOT / "README.md").read_text()
    expected = summary.readme_block(REFERENCE.read_text())
    assert summary.readme_results_block(readme) == expected, (
        "README results block differs from tests/expected/default/summary.md: run "
        ".venv/bin/python scripts/readme_results.py")


def test_reference_summary_has_headline_and_machine_parts():
    text = REFERENCE.read_text()
    headline = summary.headline_part(text)
    for section in ("**Training**", "**Primary**", "**Validity gate**", "**Table 4 panel A**",
                    "**Table 5**", "**Transfer**", "**Stability under a perturbed seed**"):
        assert section in headline
    assert summary.MACHINE_HEADING not in headline
    assert "CPU pin: on" in text.split(summary.MACHINE_HEADING)[1]


def test_replace_readme_block_keeps_the_rest_and_refuses_a_readme_without_markers():
    readme = f"intro\n{summary.README_BEGIN}\nold\n{summary.README_END}\noutro\n"
    updated = summary.replace_readme_block(readme, "# Run summary\n\n## Headline numbers\n\nx = 1\n")
    assert updated.startswith("intro\n") and updated.endswith("\noutro\n")
    assert "### Run summary" in updated and "#### Headline numbers" in updated and "old" not in updated
    assert summary.replace_readme_block(updated, "# Run summary\n\n## Headline numbers\n\nx = 1\n") == updated
    with pytest.raises(ValueError, match="no results block"):
        summary.replace_readme_block("no markers here", "x")
