"""The README a newcomer reads in ten minutes: at most 300 lines, its two commands in the first 40, the test
command the one CI runs; and every link of the README and docs/ leads to a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_is_short_and_starts_with_its_two_commands() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    first = "\n".join(lines[:40])
    assert "bash scripts/setup.sh && .venv/bin/bsops launch tiny --local\n" in first
    assert "\nbash scripts/test.sh\n" in first
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_every_link_of_the_readme_and_docs_leads_to_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)  # code: a link shown, not made
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and file.suffix == ".md":
                headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                            for h in re.findall(r"^#+ (.*)$", file.read_text(encoding="utf-8"), re.M)}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []
