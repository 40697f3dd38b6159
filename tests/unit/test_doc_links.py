"""Every relative link in the docs resolves: pages link the dated notes that hold
their measurement history (docs/notes/), and a page or note that moves must not
leave a link behind that points at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
# [text](target) and [text](target "title"); code spans are removed first.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def relative_links(page: Path) -> list[str]:
    """The links of ``page`` that name a file of the repository (no URL, no bare anchor)."""
    text = CODE.sub("", page.read_text())
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:|#", target)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    missing = [target for target in relative_links(page)
               if not (page.parent / target.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_the_check_sees_links() -> None:
    links = relative_links(REPO / "docs" / "search.md")
    assert "notes/2026-12-05-issue-33-ranking.md" in links
