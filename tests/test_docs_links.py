"""Every relative link and anchor in README.md, CHANGELOG.md and docs/ resolves: the file
exists, and an anchor names a heading of that file (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+(?:\([^()\s]*\))?[^()\s]*)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (links there are not links)."""
    kept, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation other than '-' and
    '_' removed, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links keep their text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in prose(page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        result.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return result


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def test_the_slugs_follow_github():
    assert github_slug("Scaling out (Dask)") == "scaling-out-dask"
    assert github_slug("`run_all.sh`") == "run_allsh"
    assert github_slug("One writer, whole outputs") == "one-writer-whole-outputs"
    assert github_slug("Results of the default run") == "results-of-the-default-run"


def test_the_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\n[ok](#two-words) [bad](#three) "
                                   "[gone](missing.md) `[code](nowhere.md)`\n")
    assert relative_links(tmp_path / "a.md") == ["#two-words", "#three", "missing.md"]
    assert anchors(tmp_path / "a.md") == {"title", "two-words"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor in {destination.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_docs_map_lists_every_page():
    listed = set(re.findall(r"\]\(([\w.]+\.md)\)", (ROOT / "docs" / "README.md").read_text()))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= listed, f"docs/README.md does not list {sorted(pages - listed)}"


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220
