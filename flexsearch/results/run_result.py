"""What the Python API returns: typed views of a run's score, rows and files."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexsearch.results.metrics import dig


@dataclass(frozen=True)
class Rate:
    """A metric with its 95% interval and denominator (`k` is the count, for proportions)."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    k: int | None = None

    @classmethod
    def from_dict(cls, metric: dict[str, Any] | None) -> Rate | None:
        if not metric:
            return None
        low, high = metric.get("ci", [None, None])
        return cls(metric.get("value"), low, high, int(metric.get("n", 0)), metric.get("k"))


@dataclass(frozen=True)
class Difference:
    """A difference of two rates (the fairness gap) with its small-sample 95% interval (results/differences.py)
    and the items it rests on; not a proportion, so it has no count."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    @classmethod
    def from_dict(cls, metric: dict[str, Any] | None) -> Difference | None:
        if not metric:
            return None
        low, high = metric.get("ci", [None, None])
        return cls(metric.get("value"), low, high, int(metric.get("n", 0)))


@dataclass(frozen=True)
class Score:
    """A run's score.json: the headline numbers typed, all of it in `to_dict()`.

    A clean evaluation has accuracies only; a search (or a re-scored split) adds the attack numbers."""

    items: int
    clean_accuracy: Rate | None
    accuracy_disambig: Rate | None
    abstention: Rate | None
    attacked_accuracy: Rate | None = None
    objective: str | None = None
    asr: Rate | None = None
    control_asr: Rate | None = None
    fairness_gap: Difference | None = None
    verdict: str | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Score:
        clean = data.get("clean", data)  # a clean evaluation keeps its metrics at the top
        objective = next((o for o in ("stereotype", "anti_stereotype", "untargeted")
                          if isinstance(data.get(o), dict) and "asr" in data[o]), None)
        control = data.get("anti_stereotype") if "fairness_gap" in data else None
        return cls(
            items=int(data.get("items", data.get("n_items", 0))),
            clean_accuracy=Rate.from_dict(clean.get("accuracy")),
            accuracy_disambig=Rate.from_dict(clean.get("accuracy_disambig")),
            abstention=Rate.from_dict(clean.get("abstention_rate")),
            attacked_accuracy=Rate.from_dict(dig(data, ["attacked", "accuracy"])),
            objective=objective,
            asr=Rate.from_dict(dig(data, [objective, "asr"])) if objective else None,
            control_asr=Rate.from_dict(control.get("asr")) if control else None,
            fairness_gap=Difference.from_dict(data.get("fairness_gap")),
            verdict=dig(data, ["verdict", "verdict"]),
            data=copy.deepcopy(data),
        )

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)


@dataclass(frozen=True)
class RunResult:
    """A finished search or evaluation: its directory, score, rows and the table the CLI prints.

    `rows` are the split's rows for a search and the per-item predictions for an evaluation."""

    run_dir: Path
    score: Score
    rows: list[dict[str, Any]]
    table: str
    files: dict[str, Path]


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of two runs (`data` is compare.json's content)."""

    data: dict[str, Any]
    table: str
    files: dict[str, Path]
