"""The reference docs stay reference: within their line budgets, free of project-tracker
references, and the state diagram names exactly the job loop's state classes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
BUDGETS = {ROOT / "README.md": 300, ARCHITECTURE: 300}


def state_classes() -> set[str]:
    """Classes of ``dlrover/master/states.py`` deriving from ``State`` (directly or not)."""
    tree = ast.parse((ROOT / "dlrover" / "master" / "states.py").read_text())
    bases = {n.name: {b.id for b in n.bases if isinstance(b, ast.Name)} for n in tree.body if isinstance(n, ast.ClassDef)}
    found = {"State"}
    while True:
        more = {name for name, b in bases.items() if b & found} - found
        if not more:
            return found - {"State"}
        found |= more


def diagram() -> str:
    text = ARCHITECTURE.read_text()
    section = text.split("## The job's states", 1)[1]
    return section.split("```", 2)[1]


def test_readme_and_architecture_stay_within_their_line_budgets():
    over = {p.name: n for p, limit in BUDGETS.items() if (n := len(p.read_text().splitlines())) > limit}
    assert not over, over


def test_the_state_diagram_names_exactly_the_state_classes():
    named = set(re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*\b", diagram()))
    classes = state_classes()
    events = {"Tick", "PsUnreachable", "BadInput", "JobFailed"}  # what moves between states
    assert classes and classes <= named, classes - named
    assert named - classes <= events, named - classes - events


def test_user_docs_name_no_tracker_issues():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    hits = [f"{p.name}:{i}" for p in pages for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"(?i)\bissue\s*#?\d+|(?<![\w/])#\d{2,}\b", line)]
    assert not hits, hits
