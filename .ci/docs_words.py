"""The user's pages say nothing of how the project is run: no issue numbers, commit hashes, sessions, design notes,
results folders or private module names.

``python .ci/docs_words.py [root]`` reads every user page (``docs/**/*.md``, ``README.md``, ``CHANGELOG.md``), prints
one line per hit, ``page:line: 'word' (what it is; the fix)``, and exits 1 if there is any. ``make docs`` runs it
before the build, so ``make docs-check`` (and CI) fail on such a word. ``docs/measurements.md``, the "How we
measured" page, is the one page that names the results folders; the folders' own README files hold the experiment
logs, with their commits.

Numbers and names that look like hashes but are not (a hex word with no digit, or with no letter) do not count.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
#: The one page allowed to name the results folders (it links to the experiment logs beside them).
MEASUREMENTS_PAGE = "docs/measurements.md"
#: The page for contributors, which describes the code layout: private modules are its subject.
DEVELOPMENT_PAGE = "docs/development.md"

#: (pattern, what it is, the fix), matched line by line.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bissues?[\s_-]*#?\s*\d+\b", re.IGNORECASE),
     "an issue number: say what changed, not which ticket"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
     "a commit hash: say which version or what changed"),
    (re.compile(r"(?<![.\w])sessions?\b"), "'session': a word of the project's work, not the user's"),
    (re.compile(r"\bdesign notes?\b", re.IGNORECASE), "'design note': an internal document"),
    (re.compile(r"\bthe issue's\b", re.IGNORECASE), "'the issue's': an internal ticket"),
    (re.compile(r"\blab notebook\b", re.IGNORECASE), "'lab notebook': an internal document"),
    (re.compile(r"/work/[\w/.-]*"), "a path on the project's machines"),
    (re.compile(r"\bbenchmarks/results/[\w./*-]*"),
     f"a results folder: link the measurement from {MEASUREMENTS_PAGE} instead"),
    (re.compile(r"\blossscale(?:[./][a-z]\w*)*[./]_[a-z]\w*(?:\.py)?"),
     "a private module: name the public function or option"),
)


class Hit(NamedTuple):
    page: str
    line: int
    word: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.word!r} ({self.why})"


def user_pages(root: Path) -> list[Path]:
    """The pages a user reads: every Markdown file under docs/, README.md and CHANGELOG.md."""
    pages = sorted((root / "docs").rglob("*.md"))
    return pages + [p for p in (root / "README.md", root / "CHANGELOG.md") if p.exists()]


def find_internal_words(root: Path = ROOT) -> list[Hit]:
    """Every internal word on the user pages under ``root``, in page and line order."""
    hits = []
    for path in user_pages(root):
        page = path.relative_to(root).as_posix()
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern, why in RULES:
                if page == MEASUREMENTS_PAGE and "results folder" in why:
                    continue
                if page == DEVELOPMENT_PAGE and "private module" in why:
                    continue
                hits.extend(Hit(page, number, m.group(0).strip(), why) for m in pattern.finditer(text))
    return hits


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    hits = find_internal_words(root)
    for hit in hits:
        print(hit)
    pages = len(user_pages(root))
    if hits:
        print(f"{len(hits)} internal word(s) on the user pages ({pages} pages checked); the user's manual names "
              "only what a user can see and use.")
        return 1
    print(f"no internal words on {pages} user pages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
