"""The run-level learner (DESIGN.md "The learner"): what each operator, template family, template and
composition has gained on this model, updated from finished items in deterministic rounds, and the
ranking of proposals it gives (Thompson sampling, so an arm never tried is not starved).

Every scored candidate of a search is one `Observation`: the arm that made it (the operator edit or
template applied last, or a whole composition applied at once), the templates in place after it, its
objective gain over the nearest scored ancestor and over the clean prompt, and whether it met the
objective. Observations go into each item's trace record, so the learner's state is a pure function of
the prior and the trace: a resumed run rebuilds it, and a Ray worker receives it with its chunk.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from flexsearch.data.candidate import SLOT_FIELDS, Candidate
from flexsearch.data.items import source_sha256
from flexsearch.engine.families import Archive
from flexsearch.errors import FlexsearchError
from flexsearch.files import read_json

COMPOSE = "compose"  # the ancestor of every composition arm ("compose:persona/role_play/1+instruction/...")
SHRINK = 2.0  # pseudo-observations pulling an arm's mean toward its parent's (template → family → operator)
PRIOR_SD, PRIOR_SD_WEIGHT = 0.5, 4.0  # the gain spread assumed before observations, worth this many of them
LEARNER_SCHEMA = 1
LEARNER = "learner.json"  # the learner's state in a run directory: its schema is this module's


@dataclass(frozen=True)
class Observation:
    """One scored candidate, as the learner and the weak-spots table read it."""

    arm: str  # the arms of the edits that made it from its nearest scored ancestor, '+'-joined
    composition: str  # the slot templates in place, sorted and '+'-joined ('' when none)
    gain: float  # the aim's lead (objectives.lead) minus the nearest scored ancestor's: within [-2, 2]
    lift: float  # the aim's lead minus the clean prompt's
    success: bool  # met the objective with the margin
    valid: bool  # natural text without a forced-choice template: a label-valid prompt
    replaced: str = ""  # the templates the added arms took the slots of, '+'-joined ('' when none)
    family: str = ""  # the candidate's attack family (families.family_of; '' when none)

    def to_list(self) -> list[Any]:
        return [self.arm, self.composition, self.gain, self.lift, self.success, self.valid, self.replaced, self.family]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> Observation:
        arm, composition, gain, lift, success, valid, *rest = data  # older traces lack `replaced` and `family`
        replaced, family = (*rest, "", "")[:2]
        return cls(str(arm), str(composition), float(gain), float(lift), bool(success), bool(valid), str(replaced),
                   str(family))


def edit_arm(operator: str, args: Mapping[str, Any]) -> str:
    """A template edit's arm, operator/family/index; any other edit's arm is its operator."""
    if "family" in args and "template" in args:
        return f"{operator}/{args['family']}/{args['template']}"
    return operator


def composition_of(candidate: Candidate) -> str:
    """The slot templates in place on the candidate (a slot's last edit holds its text), sorted."""
    in_place = {e.field: edit_arm(e.operator, dict(e.args)) for e in candidate.edits if e.field in SLOT_FIELDS}
    return "+".join(sorted(arm for arm in in_place.values() if arm.count("/") == 2))


def added_arms(candidate: Candidate, ancestor: Candidate) -> list[str]:
    """The arms of the edits that made `candidate` from its `ancestor`, in the order applied."""
    return [edit_arm(e.operator, dict(e.args)) for e in candidate.edits[len(ancestor.edits):]]


def replaced_arms(candidate: Candidate, ancestor: Candidate) -> list[str]:
    """The templates of `ancestor` that `candidate`'s added edits replace in their slots."""
    in_place = {e.field: edit_arm(e.operator, dict(e.args)) for e in ancestor.edits if e.field in SLOT_FIELDS}
    return [in_place[e.field] for e in candidate.edits[len(ancestor.edits):] if e.field in in_place]


def parent_arm(arm: str) -> str | None:
    """The arm one level up: template → family → operator → none; composition → 'compose'."""
    if arm.startswith(f"{COMPOSE}:"):
        return COMPOSE
    return arm.rsplit("/", 1)[0] if "/" in arm else None


def composition_parts(composition: str) -> list[str]:
    return [part for part in composition.split("+") if part]


@dataclass
class ArmStats:
    tries: int = 0
    wins: int = 0
    gain_sum: float = 0.0
    gain_sq: float = 0.0

    def add(self, gain: float, success: bool) -> None:
        self.tries += 1
        self.wins += int(success)
        self.gain_sum += gain
        self.gain_sq += gain * gain


@dataclass
class Learner:
    """Per-arm statistics of one objective's search on one model, with the ranking they give."""

    arms: dict[str, ArmStats] = field(default_factory=dict)
    items: int = 0  # items whose observations went in (a prior's included)
    archive: Archive = field(default_factory=Archive.empty)  # this run's successes per family cell (never a prior's)

    def copy(self) -> Learner:
        return copy.deepcopy(self)

    def observe(self, observation: Observation) -> None:
        """Adds one scored candidate: each arm that made it (and the arm's ancestors) learns an equal share of its
        gain plus the expected gain of the templates it replaced (their current means). A template swapped in for
        another thus learns its own effect, not its effect minus the one it displaced, which is what the ranking's
        added-minus-replaced expects; without it a template tried mostly as a swap for the leader looks weak and
        the leader is never challenged. A composition of two or more templates learns its lift over the clean
        prompt (the weak-spots ranking and the transfer check read it)."""
        added = composition_parts(observation.arm)
        restored = sum(self.mean(arm) for arm in composition_parts(observation.replaced))
        gain = (observation.gain + restored) / max(len(added), 1)
        for part in added:
            arm: str | None = part
            while arm is not None:
                self.arms.setdefault(arm, ArmStats()).add(gain, observation.success)
                arm = parent_arm(arm)
        if len(composition_parts(observation.composition)) >= 2 and observation.valid:
            lift = observation.lift
            for key in (f"{COMPOSE}:{observation.composition}", COMPOSE):
                self.arms.setdefault(key, ArmStats()).add(lift, observation.success)

    def observe_item(self, observations: Iterable[Observation]) -> None:
        for observation in observations:
            self.observe(observation)
        self.items += 1

    def observe_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Learns from item trace records, in the order given (a round's items in item order), and files their
        family successes in the archive."""
        for record in records:
            self.observe_item(observations_of(record))
            self.archive.add_record(record)

    def spread(self) -> float:
        """The pooled standard deviation of observed gains (operators' level), shrunk toward PRIOR_SD."""
        tops = [s for key, s in self.arms.items() if parent_arm(key) is None]
        n = sum(s.tries for s in tops)
        if n == 0:
            return PRIOR_SD
        mean = sum(s.gain_sum for s in tops) / n
        squares = sum(s.gain_sq for s in tops) - n * mean * mean
        return math.sqrt((max(squares, 0.0) + PRIOR_SD_WEIGHT * PRIOR_SD ** 2) / (n + PRIOR_SD_WEIGHT))

    def mean(self, arm: str) -> float:
        """The arm's expected gain, shrunk toward its parent's (an arm never tried takes its family's)."""
        parent = parent_arm(arm)
        prior = self.mean(parent) if parent is not None else 0.0
        stats = self.arms.get(arm)
        if stats is None:
            return prior
        return (stats.gain_sum + SHRINK * prior) / (stats.tries + SHRINK)

    def draw(self, arm: str, rng: np.random.Generator, spread: float) -> float:
        """One Thompson sample of the arm's gain: its mean plus noise that shrinks as it is tried."""
        tries = self.arms[arm].tries if arm in self.arms else 0
        return self.mean(arm) + spread / math.sqrt(tries + SHRINK) * float(rng.standard_normal())

    def compositions(self, limit: int) -> list[str]:
        """The best-known compositions of two or more templates, by mean lift."""
        keys = [k for k in self.arms if k.startswith(f"{COMPOSE}:")]
        return sorted(keys, key=lambda k: (-self.mean(k), k))[:limit]

    def to_dict(self) -> dict[str, Any]:
        return {"items": self.items, "arms": {key: [s.tries, s.wins, s.gain_sum, s.gain_sq]
                                              for key, s in sorted(self.arms.items())},
                "archive": self.archive.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Learner:
        arms = {str(key): ArmStats(int(v[0]), int(v[1]), float(v[2]), float(v[3])) for key, v in data["arms"].items()}
        return cls(arms=arms, items=int(data.get("items", 0)), archive=Archive.from_dict(data.get("archive") or {}))

    def summary(self, top: int = 10) -> list[dict[str, Any]]:
        """The arms of highest mean gain that were tried, for learner.json readers."""
        tried = [k for k, s in self.arms.items() if s.tries and ("/" in k or k.startswith(f"{COMPOSE}:"))]
        ranked = sorted(tried, key=lambda k: (-self.mean(k), k))[:top]
        return [{"arm": k, "mean_gain": round(self.mean(k), 4), "tries": self.arms[k].tries,
                 "wins": self.arms[k].wins} for k in ranked]


class RoundDraws:
    """One Thompson draw per arm for a round of proposals, made on first use (in pool order: deterministic)."""

    def __init__(self, learner: Learner, rng: np.random.Generator) -> None:
        self.learner, self.rng, self.spread = learner, rng, learner.spread()
        self.drawn: dict[str, float] = {}

    def __call__(self, arm: str) -> float:
        if arm not in self.drawn:
            self.drawn[arm] = self.learner.draw(arm, self.rng, self.spread)
        return self.drawn[arm]


def observations_of(record: Mapping[str, Any]) -> list[Observation]:
    return [Observation.from_list(o) for o in record.get("observations", [])]


def rebuilt(prior: Learner | None, records: Iterable[Mapping[str, Any]]) -> Learner:
    """The learner after these item records, in the order given, on top of a prior."""
    learner = prior.copy() if prior is not None else Learner()
    learner.observe_records(records)
    return learner


# ---------------------------------------------------------------- the prior (--prior RUN)


@dataclass(frozen=True)
class Prior:
    """Another run's learner, read to warm-start this one; its provenance goes into config.yaml and score.json."""

    states: dict[str, Learner]
    provenance: dict[str, Any]

    def for_objective(self, objective: str) -> Learner:
        return self.states[objective]


def read_prior(run: str | Path, objectives: Sequence[str], proposable: set[str]) -> Prior:
    """Reads RUN/learner.json. Refused in one line: a folder without one, a prior that did not search every
    objective this run searches (another objective scheme), or one holding no arm this search can propose
    (a forced-choice-only run read by a label-valid search, say)."""
    path = Path(run)
    state_file = path / LEARNER
    if not path.is_dir():
        raise FlexsearchError(f"--prior {run}: not a run folder")
    if not state_file.is_file():
        raise FlexsearchError(f"--prior {run}: no {LEARNER} (not a finished flexsearch search run)")
    data = read_json(state_file)
    if not isinstance(data, dict) or data.get("schema") != LEARNER_SCHEMA or not isinstance(data.get("objectives"),
                                                                                              dict):
        raise FlexsearchError(f"--prior {state_file}: not a learner state of schema {LEARNER_SCHEMA}")
    missing = [o for o in objectives if o not in data["objectives"]]
    if missing:
        raise FlexsearchError(f"--prior {run}: it searched {', '.join(data['objectives']) or 'nothing'}, not "
                              f"{missing[0]} (another objective scheme); choose a run with the same objectives")
    try:
        # the arms carry over, the archive does not: it holds the other run's finds, not this run's
        states = {o: replace(Learner.from_dict(data["objectives"][o]), archive=Archive.empty()) for o in objectives}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise FlexsearchError(f"--prior {state_file}: malformed learner state") from None
    for objective, state in states.items():
        usable = {key for key, s in state.arms.items() if s.tries} & proposable
        if not usable:
            raise FlexsearchError(f"--prior {run}: its {objective} learner holds no arm this search can propose "
                                  "(a forced-choice-only run, or other operators); choose a run with the same "
                                  "operators and effects")
    provenance = {"run": str(run), "learner_sha256": source_sha256(str(state_file)), "model": data.get("model"),
                  "data": data.get("data"), "items": {o: states[o].items for o in objectives},
                  "method": data.get("method")}
    return Prior(states, provenance)


def learner_document(states: Mapping[str, Learner], method: str, model: Any, data: str,
                     prior: Mapping[str, Any] | None) -> dict[str, Any]:
    """learner.json: each objective's arm statistics ([tries, wins, gain sum, gain sum of squares]), its best
    arms, and where a prior came from."""
    return {"schema": LEARNER_SCHEMA, "method": method, "model": model, "data": data, "prior": prior,
            "objectives": {o: {**s.to_dict(), "best": s.summary()} for o, s in states.items()}}
