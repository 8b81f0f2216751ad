"""Every reference to the design docs resolves to a heading (docs/architecture.md#code-shape).

The code and the docs cite a section as `docs/NAME.md#anchor` (a link, in markdown), with the
anchor GitHub gives the heading. A renamed heading breaks its citations, and this test names
them; a section cited by its quoted title instead would drift silently, so that form is refused.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
# docs/NAME.md or, inside docs/ and README links, NAME.md; an optional #anchor
CITATION = re.compile(r"(?<![\w/.-])(?:docs/)?([a-z][a-z0-9_-]*\.md)(#[\w-]+)?")
# NAME.md, "Title", also with the title on the next line of a comment, docstring or string
QUOTED_TITLE = re.compile(
    r"(?<![\w/.-])(?:docs/)?([a-z][a-z0-9_-]*\.md),?[ \t]*(?:\"?[ \t]*\n[ \t]*[#'\"]?[ \t]*)?\(?\"[A-Z`]"
)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped but for hyphens
    and underscores, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, duplicates numbered as GitHub numbers them (-1, -2, ...);
    fenced code is not a heading."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = anchor(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def _cited_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    keep = []
    for name in tracked:
        if name.startswith("reports/") or not name.endswith((".py", ".md", ".toml")):
            continue
        if (ROOT / name).is_file():
            keep.append(ROOT / name)
    return keep


def _doc_names() -> set[str]:
    return {p.name for p in DOCS.glob("*.md")}


def test_every_cited_section_is_a_heading():
    docs = {name: anchors(DOCS / name) for name in _doc_names()}
    broken = []
    for path in _cited_files():
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            name, fragment = m.group(1), m.group(2)
            if name not in docs:
                continue  # README.md, CHANGELOG.md and files outside docs/ are not cited by section
            if fragment and fragment[1:] not in docs[name]:
                line = text.count("\n", 0, m.start()) + 1
                broken.append(f"{path.relative_to(ROOT)}:{line}: {name}{fragment}")
    assert not broken, "citations of headings that are not there:\n" + "\n".join(broken)


def test_sections_are_cited_by_anchor_not_by_quoted_title():
    docs = _doc_names()
    quoted = []
    for path in _cited_files():
        text = path.read_text(encoding="utf-8")
        for m in QUOTED_TITLE.finditer(text):
            if m.group(1) in docs:
                line = text.count("\n", 0, m.start()) + 1
                quoted.append(f"{path.relative_to(ROOT)}:{line}: {text[m.start() : m.end() + 30].splitlines()[0]}")
    assert not quoted, "cite a section as docs/NAME.md#anchor:\n" + "\n".join(quoted)


def test_quoted_titles_are_found_however_the_line_breaks():
    md = ".md"  # spelled apart so that this file does not cite by title itself
    for text in (
        f'see docs/statistics{md}, "Walked tau".',
        f'# (docs/statistics{md},\n# "Walked tau")',
        f'"an A40 (docs/performance-model{md}, "\n        \'"GEMM row efficiency"). "',
    ):
        assert QUOTED_TITLE.search(text), text
    assert not QUOTED_TITLE.search('(ROOT / "docs" / "python.md").read_text()')


def test_anchor_follows_githubs_rule():
    """Anchors as GitHub renders them for headings of these kinds (checked on github.com)."""
    assert anchor("Which tau is used when") == "which-tau-is-used-when"
    assert anchor("`treeopt run`: the main job") == "treeopt-run-the-main-job"
    assert anchor("IBM's candidate form") == "ibms-candidate-form"
    assert anchor("Draft-model trees (rejection sampling)") == "draft-model-trees-rejection-sampling"
    assert anchor("τ from rank vectors") == "τ-from-rank-vectors"
    text = "# A\n## B\n```\n# not a heading\n```\n## B\n"
    path = ROOT / "tests" / "_anchors_probe.md"
    try:
        path.write_text(text)
        assert anchors(path) == {"a", "b", "b-1"}
    finally:
        path.unlink()
