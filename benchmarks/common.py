"""Shared pieces of the benchmark scripts: BBQ prompts, timing, machine facts, RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item, load_items
from flexsearch.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BBQ = ROOT.parent / "shared" / "data" / "bbq"


def bbq_items(category: str = "Age", limit: int = 48, condition: str | None = None) -> list[Item]:
    """Real BBQ items (benchmarks may read ../shared; tests may not)."""
    items = load_items(BBQ / f"{category}.jsonl").items
    if condition:
        items = [it for it in items if it.condition == condition]
    return items[:limit]


def roots(items: list[Item]) -> list[Candidate]:
    return [Candidate.root(it) for it in items]


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, float]:
    """(result of the last call, best wall time over `repeats`)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return (f"{os.cpu_count()} cores, {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
            f"Python {platform.python_version()}")


def matmul_flops(dtype: torch.dtype = torch.float32, size: int = 1536, repeats: int = 8,
                 device: str = "cpu") -> float:
    """The machine's dense matmul throughput (FLOP/s) in this dtype, best of a few runs."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.matmul(a, b)

    def run() -> None:
        for _ in range(repeats):
            torch.matmul(a, b)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    _, seconds = timed(run, repeats=3)
    return 2 * size**3 * repeats / seconds


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def record(title: str, body: str) -> None:
    """Prints the section and writes it into RESULTS.md with date, machine and the exact command: in place of
    the section of the same title (git keeps the old figures), or at the end when the title is new."""
    command = " ".join(shlex.quote(a) for a in ["python", *sys.orig_argv[1:]])
    section = (f"## {title}\n\n{datetime.datetime.now():%Y-%m-%d %H:%M} · {machine()}\n\n"
               f"Command: `{command}`\n\n{body}\n")
    print(section)
    atomic_write_text(RESULTS, with_section(RESULTS.read_text(encoding="utf-8"), title, section))


CONTENTS = ("<!-- contents: rebuilt by benchmarks.common.record -->", "<!-- /contents -->")


def with_section(document: str, title: str, section: str | None) -> str:
    """The document with `section` in place of the one headed `## title` (appended when there is none; None removes
    it), and its contents list (between the CONTENTS markers) rebuilt from the section headings."""
    head, titles, sections = split_sections(document)
    if section is None:
        sections.pop(titles.index(title))
        titles.remove(title)
    elif title in titles:
        sections[titles.index(title)] = section.strip() + "\n\n"
    else:
        sections.append(section.strip() + "\n\n")
        titles.append(title)
    if sections and not sections[-1].endswith("\n\n"):
        sections[-1] = sections[-1].rstrip() + "\n\n"
    start, end = CONTENTS
    if start in head and end in head:
        listing = "\n".join(f"- [{t}](#{anchor(t)})" for t in titles)
        head = head[: head.index(start) + len(start)] + "\n" + listing + "\n" + head[head.index(end):]
    return (head + "".join(sections)).rstrip() + "\n"


def split_sections(document: str) -> tuple[str, list[str], list[str]]:
    """(the text before the first `## ` heading, the section titles, the sections with their headings)."""
    head, *sections = re.split(r"(?m)^(?=## )", document)
    return head, [s.splitlines()[0][3:].strip() for s in sections], sections


EXPERIMENTS = ROOT / "benchmarks" / "EXPERIMENTS.md"


def logged(results: str, experiments: str, title: str, logged_as: str, why: str) -> tuple[str, str]:
    """(RESULTS.md without the section `title`, EXPERIMENTS.md with it first as `logged_as`, saying why it left:
    the log is newest first)."""
    _, titles, sections = split_sections(results)
    if title not in titles:
        raise SystemExit(f"RESULTS.md has no section {title!r}")
    body = sections[titles.index(title)].split("\n", 1)[1].strip()
    head, _, entries = split_sections(experiments)
    entry = f"## {logged_as}\n\nWhy it left RESULTS.md: {why}\n\n{body}\n\n"
    return with_section(results, title, None), head + entry + "".join(entries).rstrip() + "\n"


def retire(title: str, logged_as: str, why: str) -> None:
    """Moves a section that no longer holds a benchmark's current figures from RESULTS.md to EXPERIMENTS.md."""
    results, experiments = logged(RESULTS.read_text(encoding="utf-8"), EXPERIMENTS.read_text(encoding="utf-8"),
                                  title, logged_as, why)
    atomic_write_text(EXPERIMENTS, experiments)
    atomic_write_text(RESULTS, results)


def anchor(title: str) -> str:
    """GitHub's link target for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Move a RESULTS.md section to EXPERIMENTS.md (superseded runs, "
                                     "recipes not kept), rebuilding the contents list.")
    parser.add_argument("title", help="the section's title in RESULTS.md")
    parser.add_argument("--as", dest="logged_as", required=True, help="its title in EXPERIMENTS.md")
    parser.add_argument("--why", required=True, help="why it left RESULTS.md (one sentence or two)")
    options = parser.parse_args()
    retire(options.title, options.logged_as, options.why)
