"""The typed Python API: `flexsearch.search`, `flexsearch.evaluate`, `flexsearch.compare` and `flexsearch.audit`.
It turns arguments into typed settings and hands them to the run pipeline (flexsearch/pipeline/), which does the
work; the CLI is a thin layer over these functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from flexsearch.config import Origins, ScoringConfig, SearchConfig, check_settings, load_config, scoring_options
from flexsearch.data.render import PromptFormat
from flexsearch.errors import FlexsearchError
from flexsearch.files import atomic_write_json, atomic_write_text
from flexsearch.pipeline.evaluate import evaluate_data, evaluate_split
from flexsearch.pipeline.mutate import mutate
from flexsearch.pipeline.run import default_run_dir
from flexsearch.pipeline.search import audit_emitted, run_search_command
from flexsearch.pipeline.target import RayOptions, Target, as_target
from flexsearch.results import Comparison, RunResult
from flexsearch.results.run_dir import check_output_folder, read_jsonl
from flexsearch.results.run_files import FAMILY_JSONL, SPLIT_FILES, SPLIT_JSONL

__all__ = ["RayOptions", "Target", "audit", "compare", "default_run_dir", "evaluate", "mutate", "registries", "search"]
# names this module defined before the run pipeline had its own package: still importable from here, with a warning
_MOVED = {"SEARCH_PROMPT_MARGIN": "flexsearch.pipeline.search", "split_file_of": "flexsearch.pipeline.search",
          "family_block": "flexsearch.pipeline.search"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(f"flexsearch.api.{name} is deprecated: import it from {_MOVED[name]}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module 'flexsearch.api' has no attribute {name!r}")


def search(data: str = "seed", *, model: str | Target = "smollm2", out: str | Path | None = None,
           config: str | SearchConfig = "default", overrides: Sequence[str] = (), budget: int | None = None,
           method: str | None = None, objective: str | None = None, control: bool | None = None,
           seed: int | None = None, limit: int | None = None, ray: RayOptions | None = None,
           prior: str | Path | None = None, capability: str | None = None, slot: str | None = None) -> RunResult:
    """Runs (or resumes) a search into `out` and returns its score, split rows and files.

    `config` is a preset name, a YAML path or a SearchConfig; `overrides` are `key=value` strings
    as for `--set`; the keyword options override both (CLI > YAML > defaults). `prior` is an earlier run
    whose learner.json warm-starts the learner (its queries are not this run's). `slot` (scoring.slot) puts the
    attack text of chat prompts in the user turn or a system message. `capability` is BBQ-style data
    whose disambiguated items are scored clean beside the search: the verdict reads the model's capability from
    them (data without disambiguated items cannot show it)."""
    resolved_config = _search_config(config, overrides, budget=budget, method=method, objective=objective,
                                     control=control, seed=seed, prior=None if prior is None else str(prior),
                                     scoring_slot=slot)
    run_dir = Path(out) if out is not None else default_run_dir(data, config if isinstance(config, str) else "api")
    return run_search_command(data, as_target(model), run_dir, resolved_config, overrides, limit, ray, capability)


def _search_config(config: str | SearchConfig, overrides: Sequence[str], **options: Any) -> SearchConfig:
    if isinstance(config, str):
        return load_config(config, list(overrides), **options)
    if overrides:
        raise FlexsearchError("overrides apply to a preset name or YAML path, not to a SearchConfig object")
    given, scoring = scoring_options(options)
    return replace(config, **given, scoring=replace(config.scoring, **scoring))


def evaluate(data: str | None = None, *, split: str | Path | None = None, model: str | Target = "smollm2",
             out: str | Path | None = None, limit: int | None = None, mode: str = "plain", slot: str = "user",
             average_orders: bool = True, batch_size: int = 16) -> RunResult:
    """Scores items clean (`data`) or re-scores a split's attacked prompts and their clean versions
    (`split`) on a model; returns the score, per-item predictions and files. `slot` places a split's attack
    text in chat mode: in the user turn, or as the system message."""
    if (data is None) == (split is None):
        raise FlexsearchError("give exactly one of --data or --split")
    scoring = {"mode": mode, "slot": slot, "average_orders": average_orders, "batch_size": batch_size}
    origins = Origins()
    for key in scoring:
        origins.set(f"scoring.{key}", f"--{key.replace('_', '-')}")
    check_settings(ScoringConfig, scoring, origins, "scoring.")
    PromptFormat(mode=mode, slot=slot)  # a system slot without chat mode: one line, before the model loads
    target = as_target(model)
    if split is not None:
        default = Path("runs") / f"{Path(split).parent.name}-on-{Path(target.model).stem}"
        run_dir = Path(out) if out is not None else default
        return evaluate_split(Path(split), run_dir, target, scoring, limit)
    run_dir = Path(out) if out is not None else default_run_dir(str(data), "eval")
    return evaluate_data(str(data), run_dir, target, scoring, limit)


def registries() -> dict[str, dict[str, str]]:
    """Name → one-line description of everything registered, by kind."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS
    from flexsearch.engine.methods import SEARCH_METHODS
    from flexsearch.objectives import OBJECTIVES
    from flexsearch.scoring.backends.base import BACKENDS, load_backends
    from flexsearch.scoring.model import ALIAS_DESCRIPTIONS
    from flexsearch.zoo.policies import POLICIES

    load_backends()
    return {"model aliases": dict(ALIAS_DESCRIPTIONS), "label policies (finetune)": POLICIES.describe(),
            "operators": OPERATORS.describe(), "constraints": CONSTRAINTS.describe(),
            "objectives": OBJECTIVES.describe(),
            "search methods": SEARCH_METHODS.describe(), "scoring backends": BACKENDS.describe()}


def audit(run: str | Path) -> dict[str, Any]:
    """The label-validity audit (flexsearch/data/audit.py) of a search run's emitted rows: the benchmark split, the
    family split, and the forced-choice and research rows when present; `benchmark` is the split.jsonl part
    alone."""
    path = Path(run)
    if not (path / SPLIT_JSONL).is_file():
        raise FlexsearchError(f"{path}: no {SPLIT_JSONL} (not a finished search run directory)")
    emitted = [*(jsonl for jsonl, _ in SPLIT_FILES), FAMILY_JSONL]
    return audit_emitted([{**row, "file": jsonl} for jsonl in emitted if (path / jsonl).is_file()
                   for row in read_jsonl(path / jsonl)])


def compare(run_a: str | Path, run_b: str | Path, out: str | Path | None = None) -> Comparison:
    """Paired comparison of two run directories on their shared items; writes compare.json and
    compare.md under `out` when given."""
    from flexsearch.results.comparison import compare_runs, format_comparison

    result = compare_runs(Path(run_a), Path(run_b))
    text = format_comparison(result)
    files: dict[str, Path] = {}
    if out is not None:
        check_output_folder(Path(out), "--out", "compare.json", ("compare.json", "compare.md"))
        files = {"compare.json": Path(out) / "compare.json", "compare.md": Path(out) / "compare.md"}
        atomic_write_json(files["compare.json"], result)
        atomic_write_text(files["compare.md"], f"```\n{text}\n```\n")
    return Comparison(result, text, files)
