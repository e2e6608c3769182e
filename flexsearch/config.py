"""Search configuration: YAML presets → dataclasses, with `--set key=value` overrides (CLI > YAML > defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from flexsearch.errors import FlexsearchError

METHODS = ("greedy", "beam", "evolutionary")


@dataclass
class ScoringConfig:
    mode: str = "plain"  # plain | chat
    average_orders: bool = True  # average over the three cyclic option orders (cancels letter bias)
    batch_size: int = 16
    prefix_reuse: bool = True


@dataclass
class SearchConfig:
    method: str = "beam"  # greedy | beam | evolutionary
    objective: str = "stereotype"
    control: bool = True  # also run the anti-stereotype search (the counter-stereotype control)
    budget: int = 40  # prompts scored per item and objective, the clean prompt included
    seed: int = 0
    item_batch: int = 8  # items searched together; their prompts share forward passes
    steps: int = 8  # beam/evolutionary iterations at most
    beam_width: int = 2
    population: int = 6
    importance: str = "leave_one_out"  # greedy word ranking: leave_one_out | gradient
    stop_on_success: bool = True
    operators: list[Any] = field(default_factory=lambda: [{"name": "persona", "n": 2},
                                                          {"name": "instruction", "n": 2},
                                                          {"name": "textbugger", "positions": 1,
                                                           "per_position": 2}])
    constraints: list[Any] = field(default_factory=lambda: ["protected_spans", "unique_positions",
                                                            {"name": "edit_budget", "max_share": 0.25},
                                                            "polarity_guard",
                                                            {"name": "similarity", "threshold": 0.8}])
    scoring: ScoringConfig = field(default_factory=ScoringConfig)

    def __post_init__(self) -> None:
        # One spec form, a mapping with a name, so equal configs compare equal however they were written.
        self.operators = [{"name": s} if isinstance(s, str) else dict(s) for s in self.operators]
        self.constraints = [{"name": s} if isinstance(s, str) else dict(s) for s in self.constraints]
        if self.method not in METHODS:
            raise FlexsearchError(f"unknown search method '{self.method}' (choose from {', '.join(METHODS)})")
        if self.budget < 2:
            raise FlexsearchError("budget must allow the clean prompt and at least one attack (>= 2)")


def packaged_yaml(name_or_path: str, folder: str = "", kind: str = "config preset") -> Path:
    """A YAML path, or the name of a file shipped in configs/ (or a folder of it, e.g. 'tune')."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise FlexsearchError(f"{kind} file not found: {path}")
        return path
    shipped = resources.files("flexsearch.configs")
    if folder:
        shipped = shipped.joinpath(folder)
    found = shipped.joinpath(f"{name_or_path}.yaml")
    if not found.is_file():
        known = sorted(p.name.removesuffix(".yaml") for p in shipped.iterdir() if p.name.endswith(".yaml"))
        raise FlexsearchError(f"unknown {kind} '{name_or_path}' (known: {', '.join(known)})")
    return Path(str(found))


def preset_path(name_or_path: str) -> Path:
    """A YAML path, or the name of a preset in configs/ (e.g. 'default', 'flex')."""
    return packaged_yaml(name_or_path)


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise FlexsearchError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(known)}")
    values = dict(data)
    if isinstance(values.get("scoring"), dict):
        values["scoring"] = _build(ScoringConfig, values["scoring"], f"{where}: scoring")
    return cls(**values)


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """'scoring.batch_size=8' → data['scoring']['batch_size'] = 8 (the value is parsed as YAML)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise FlexsearchError(f"--set expects key=value, got {assignment!r}")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = yaml.safe_load(raw)


def load_config(preset: str | None = None, overrides: list[str] | None = None,
                **cli: Any) -> SearchConfig:
    """Defaults, then the YAML preset, then --set overrides, then explicit CLI options (not None)."""
    data: dict[str, Any] = {}
    if preset:
        path = preset_path(preset)
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise FlexsearchError(f"{path}: expected a mapping of settings")
        data.update(loaded)
    for assignment in overrides or []:
        apply_override(data, assignment)
    data.update({k: v for k, v in cli.items() if v is not None})
    return _build(SearchConfig, data, preset or "config")


def config_dict(config: SearchConfig) -> dict[str, Any]:
    return asdict(config)
