"""What every run command shares: its default folder, the run directory opened and locked before the model
loads, the scorer loaded under a bar, and the items that fit the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flexsearch.data.items import Item, LoadResult
from flexsearch.pipeline.target import Target
from flexsearch.results.printing import elapsed_bar
from flexsearch.results.run_dir import RunDirectory, software_versions
from flexsearch.scoring.backends.served_options import is_served
from flexsearch.scoring.scorer import Scorer, build_scorer, fit_context


def default_run_dir(*parts: str) -> Path:
    return Path("runs") / "-".join(Path(p).stem for p in parts)


def fitting_items(loaded: LoadResult, scorer: Scorer, margin: int) -> tuple[list[Item], dict[str, int]]:
    """Items whose prompt fits the model, and the skipped ones counted by reason."""
    items, too_long = fit_context(loaded.items, scorer, margin)
    return items, dict(loaded.skipped + too_long)


@contextmanager
def opened_run(out: Path, resolved: dict[str, Any], target: Target) -> Iterator[tuple[RunDirectory, Scorer]]:
    """Checks the run directory (before the model loads), locks it, loads the scorer and records the
    resolved settings: a new run writes config.yaml, a resumed one must match it on every key."""
    command = resolved["command"]
    run = RunDirectory(out, command)
    resuming = run.check(resolved)
    with run:
        scorer = _loaded_scorer(target, resolved["scoring"])
        resolved.update(model=scorer.info, versions=software_versions())
        if resuming:
            run.check(resolved, model_loaded=True)
        if not resuming or command != "search":
            run.write_config(resolved)
        yield run, scorer


def _loaded_scorer(target: Target, scoring: dict[str, Any]) -> Scorer:
    """Loads the target under a ticking bar on a terminal: a first load (a GGUF's conversion) takes tens of
    seconds before any progress bar of the work can move. Not in logs and pipes, where a bad model's error
    stays the only line."""
    adapter = f" + adapter {target.adapter}" if target.adapter else ""
    verb, done = ("connecting to", "connected to") if is_served(target.model) else ("loading model", "loaded")
    with elapsed_bar(f"{verb} {target.model}{adapter}") as bar:
        scorer = build_scorer(target.arguments(), scoring)
        if bar is not None:
            where = (scorer.info["served"]["host"] if "served" in scorer.info
                     else f"{scorer.info.get('device')}, {scorer.info.get('dtype')}")
            bar.set_description_str(f"{done} {target.model}{adapter} ({where})")
    return scorer
