"""The check's report: markdown and JSON rewritten after every entry, so a run cut short keeps what it found."""
from __future__ import annotations

import contextlib
import json
import time
import traceback
from pathlib import Path


class Report:
    """Sections in run order; each holds lines (markdown) and named results (JSON) and ends ok, failed
    (a check did not hold), error (an exception) or skipped."""

    def __init__(self, out_dir: Path, title: str):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.md_path, self.json_path = out_dir / "gpu_report.md", out_dir / "gpu_report.json"
        self.title = title
        self.header: list[str] = []
        self.sections: dict[str, dict] = {}
        self.current: dict | None = None

    def note(self, text: str) -> None:
        """A line of the report's header (machine, versions), or of the current section."""
        (self.current["lines"] if self.current else self.header).append(text)
        print(text, flush=True)
        self._write()

    def result(self, key: str, value, ok: bool | None = None, text: str | None = None) -> None:
        """A measured value of the current section; ok=False marks the section failed."""
        self.current["results"][key] = value
        if ok is False:
            self.current["status"] = "failed"
        line = text or f"{key}: {value}"
        self.note(line if ok is None else f"{'PASS' if ok else 'FAIL'} {line}")

    def skip(self, reason: str) -> None:
        self.current["status"] = "skipped"
        self.note(f"skipped: {reason}")

    @contextlib.contextmanager
    def section(self, name: str, title: str):
        """Runs the block as one section; an exception ends that section only."""
        self.current = self.sections[name] = {"title": title, "status": "running", "lines": [], "results": {},
                                              "seconds": None}
        print(f"\n== {title}", flush=True)
        started = time.perf_counter()
        try:
            yield self
            if self.current["status"] == "running":
                self.current["status"] = "ok"
        except Exception as exc:
            self.current["status"] = "error"
            self.current["error"] = f"{type(exc).__name__}: {exc}"
            self.note("ERROR " + "".join(traceback.format_exception(exc)[-6:]).rstrip())
        finally:
            self.current["seconds"] = round(time.perf_counter() - started, 1)
            self.current = None
            self._write()

    @property
    def ok(self) -> bool:
        return all(s["status"] in ("ok", "skipped") for s in self.sections.values())

    def _write(self) -> None:
        md = [f"# {self.title}", "", *self.header, ""]
        for _name, s in self.sections.items():
            md += [f"## {s['title']} — {s['status']}" + (f" ({s['seconds']} s)" if s["seconds"] is not None else ""),
                   "", *(f"    {line}" if "\n" in line else f"- {line}" for line in s["lines"]), ""]
        self.md_path.write_text("\n".join(md))
        self.json_path.write_text(json.dumps({"header": self.header, "sections": self.sections}, indent=1,
                                             default=str))
