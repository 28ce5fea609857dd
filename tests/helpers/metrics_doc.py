"""Reads docs/metrics.md's tables and a scraped page, for the tests that keep the two in step."""
from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `([\w:]+)` \| (\w+) \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, set[str]]]:
    """family name -> (type, label names) from the doc's table rows."""
    rows = {}
    for name, kind, labels in ROW.findall(DOC.read_text()):
        rows[name] = (kind, {label.strip() for label in labels.split(",") if label.strip() not in ("", "—")})
    return rows


def exported(text: str) -> dict[str, tuple[str, set[str]]]:
    """family name -> (type, label names) of a scraped page. A counter printed with `_total` is named
    so (the parser drops the suffix); histograms' `le` is left out, as documented."""
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))  # the names as printed
    families = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:
            continue
        name = family.name + "_total" if family.name + "_total" in declared else family.name
        families[name] = (family.type, {k for sample in family.samples for k in sample.labels} - {"le"})
    return families


def undocumented(text: str) -> list[str]:
    """What a page exports that the doc misses or describes with another type or other labels."""
    docs = documented()
    problems = []
    for name, (kind, labels) in sorted(exported(text).items()):
        if name not in docs:
            problems.append(f"{name}: exported but not in {DOC.name}")
        elif docs[name] != (kind, labels):
            problems.append(f"{name}: exported {kind} {sorted(labels)}, documented {docs[name]}")
    return problems
