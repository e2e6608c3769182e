"""Search configuration: YAML presets → dataclasses, with `--set key=value` overrides (CLI > YAML > defaults)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item
from flexsearch.data.render import MODES, SLOTS, SYSTEM_NEEDS_CHAT
from flexsearch.engine.families import FAMILIES
from flexsearch.errors import LARGEST, FlexsearchError, InputError
from flexsearch.files import read_text
from flexsearch.objectives import SUCCESS_MARGIN

PROPOSALS = ("sampled", "gradient")


@dataclass
class ScoringConfig:
    mode: str = "plain"  # plain | chat
    slot: str = "user"  # chat mode: the attack text in the user turn, or "system": a system message of its own
    average_orders: bool = True  # average over the three cyclic option orders (cancels letter bias)
    batch_size: int = 16
    prefix_reuse: bool = True
    max_prompt_tokens: int = 0  # items whose prompt is longer are skipped (0: the model's context length)


@dataclass
class SearchConfig:
    method: str = "learned"  # learned | greedy | beam | evolutionary | random (the baseline: no selection)
    objective: str = "stereotype"
    control: bool = True  # also run the anti-stereotype search (the counter-stereotype control)
    budget: int = 40  # prompts scored per item and objective, the clean prompt included
    seed: int = 0
    item_batch: int = 8  # items searched together; their prompts share forward passes
    learner_round: int = 16  # items searched with one learner state; it learns from them before the next round
    prior: str = ""  # a run folder whose learner.json warm-starts the learner (--prior)
    steps: int = 8  # beam/evolutionary iterations at most
    beam_width: int = 2
    population: int = 6
    importance: str = "leave_one_out"  # greedy word ranking: leave_one_out | gradient
    proposals: str = "sampled"  # word edits: sampled positions | gradient (every position, best first-order gain)
    gradient_top: int = 4  # with gradient proposals: word edits scored per expanded candidate
    stop_on_success: bool = True
    # the learned search with averaged orders (other searches score every candidate whole): a candidate whose aim
    # lead in its displayed order alone is below this is not scored in the other two orders (1 query, not 3);
    # -1 screens nothing (every lead is at least -1)
    screen_lead: float = -1.0
    success_margin: float = SUCCESS_MARGIN  # P(aim) must beat every other answer by this much (no near ties)
    # the attack families the learned search fills (DESIGN.md "Attack families"): an item's search goes on after its
    # first success until each of them has one or the budget is spent; [] searches family-blind, stopping at the
    # first success. Every method's run keeps the hardest prompt it scored in each family.
    families: list[Any] = field(default_factory=lambda: list(FAMILIES))
    family_shares: dict[str, Any] = field(default_factory=dict)  # family → fixed share of each item's budget
    coverage: float = 0.5  # within a family, how much a template family's share of the archive cell lowers its rank
    # before an item's first success, how much a headline proposal's archive share (its family cell) lowers its rank:
    # the headline's first success becomes its family's, so a headline that repeats the leader narrows the split
    headline_coverage: float = 1.0
    # once this share of an item's budget is spent without a success, one headline proposal a round is ranked by
    # drawn gain alone (as the family-blind search ranks it): an item only the leader breaks still gets it; 1: never
    leader_after: float = 0.5
    family_share: float = 0.4  # before an item's first success, the share of its candidates that serve open families
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
        from flexsearch.engine.methods import SEARCH_METHODS, readers

        SEARCH_METHODS.get(self.method)  # an unknown name is refused with a did-you-mean
        if self.proposals not in PROPOSALS:
            raise FlexsearchError(f"unknown proposals '{self.proposals}' (choose from {', '.join(PROPOSALS)})")
        if self.proposals == "gradient" and self.method not in readers("proposals"):
            raise FlexsearchError(f"proposals: gradient works with method {' or '.join(readers('proposals'))} "
                                  f"({self.method} chooses its proposals its own way)")
        if self.gradient_top < 1:
            raise FlexsearchError(f"gradient_top must be at least 1, got {self.gradient_top}")


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


def preset_names() -> list[str]:
    """The presets shipped in configs/."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("flexsearch.configs").iterdir()
                  if p.name.endswith(".yaml"))


class StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses YAML aliases (`*name`): a config never needs them, and a few lines of nested
    aliases expand to billions of nodes (a 'billion laughs' bomb that would hang the program); and a key given
    twice in one mapping, where YAML would silently keep the last."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' is given twice (first at line {first[key]})", key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"aliases (*{event.anchor}) are not allowed in a config",
                                              event.start_mark)
        return super().compose_node(parent, index)


def safe_yaml(text: str) -> Any:
    """YAML text as data, with the safe loader and no aliases."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506  (StrictLoader is a SafeLoader)


def read_yaml(path: Path) -> tuple[Any, dict[str, int]]:
    """A YAML file's data and the line of every mapping key (dotted for nested keys, 1-based).

    A syntax error or an unsafe tag (`!!python/...`) is one InputError naming the file and line."""
    try:
        text = read_text(path)
        node = yaml.compose(text, Loader=StrictLoader)
        data = safe_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        context, started = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and started is not None and (mark is None or started.line != mark.line):
            problem += f" ({context} started at line {started.line + 1})"
        raise InputError(path, mark.line + 1 if mark else None, None, f"YAML error: {problem}") from None
    lines: dict[str, int] = {}

    def walk(current: Any, prefix: str) -> None:
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                dotted = f"{prefix}{key.value}"
                lines[dotted] = key.start_mark.line + 1
                walk(value, f"{dotted}.")

    walk(node, "")
    return data, lines


class Origins:
    """Where each setting came from, so an error names the file and line, or the option."""

    def __init__(self) -> None:
        self._where: dict[str, str] = {}

    def set(self, key: str, where: str) -> None:
        self._where[key] = where

    def by_override(self, key: str) -> bool:
        """Whether the setting was given by a --set (a preset's value is the preset's business)."""
        return self._where.get(key, "").startswith("--set ")

    def error(self, key: str, message: str) -> FlexsearchError:
        parts = key.split(".")
        where = next((self._where[".".join(parts[:k])] for k in range(len(parts), 0, -1)
                      if ".".join(parts[:k]) in self._where), "config")
        return FlexsearchError(f"{where}: field '{key}': {message}")


_RANGES: dict[str, tuple[float, str]] = {  # setting → (least value, why)
    "seed": (0, "a seed"),  # budget: check_budget, the one budget rule
    "item_batch": (1, "items per batch"), "learner_round": (1, "items per learner round"),
    "steps": (1, "iterations"), "beam_width": (1, "beams"),
    "population": (1, "members"), "gradient_top": (1, "word edits scored per expansion"),
    "scoring.batch_size": (1, "prompts per forward pass"),
    "scoring.max_prompt_tokens": (0, "tokens; 0 means the model's context length"),
    "success_margin": (0, "a probability difference"),
    "screen_lead": (-1, "an aim lead; -1 screens nothing"),
    "coverage": (0, "a weight on the archive share"),
    "headline_coverage": (0, "a weight on the archive share"),
    "leader_after": (0, "a share of the budget"),
}
_BELOW: dict[str, float] = {"success_margin": 1, "screen_lead": 1}  # setting → the value it must stay under
_CHOICES: dict[str, tuple[str, ...]] = {"importance": ("leave_one_out", "gradient"),
                                        "proposals": PROPOSALS, "scoring.mode": MODES, "scoring.slot": SLOTS}


def _type_error(value: Any, expected: Any) -> str | None:
    """Why `value` is not of the annotated type (int, float, bool, str, list), or None."""
    names = {int: "an integer", float: "a number", bool: "true or false", str: "text", list: "a list"}
    origin = getattr(expected, "__origin__", expected)
    if origin not in names:
        return None
    fits = (isinstance(value, bool) if origin is bool else
            isinstance(value, (int, float)) and not isinstance(value, bool) if origin is float else
            isinstance(value, int) and not isinstance(value, bool) if origin is int else isinstance(value, origin))
    return None if fits else f"expected {names[origin]}, got {value!r}"


def check_settings(cls: type, data: dict[str, Any], origins: Origins, prefix: str = "") -> None:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise origins.error(dotted, f"unknown setting{hint}; known: {', '.join(sorted(known))}")
        if hints[key] is ScoringConfig:
            if not isinstance(value, dict):
                raise origins.error(dotted, f"expected a mapping of scoring settings, got {value!r}")
            check_settings(ScoringConfig, value, origins, f"{dotted}.")
            continue
        problem = _type_error(value, hints[key])
        if problem:
            raise origins.error(dotted, problem)
        if isinstance(value, float) and not math.isfinite(value):
            raise origins.error(dotted, f"must be a finite number, got {value}")
        if dotted in _BELOW and value >= _BELOW[dotted]:
            raise origins.error(dotted, f"must be below {_BELOW[dotted]:g}, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and value > LARGEST:
            raise origins.error(dotted, f"must be at most {LARGEST} (far beyond what a run can use), got {value}")
        if dotted in _RANGES and value < _RANGES[dotted][0]:
            least, what = _RANGES[dotted]
            raise origins.error(dotted, f"must be at least {least:g} ({what}), got {value}")
        if dotted in _CHOICES and value not in _CHOICES[dotted]:
            raise origins.error(dotted, f"expected one of {', '.join(_CHOICES[dotted])}, got {value!r}")


def family_problem(families: list[Any], shares: dict[str, Any]) -> tuple[str, str] | None:
    """(setting, why) when the searched families or their fixed budget shares cannot work, else None."""
    for name in [*families, *shares]:
        if name not in FAMILIES:
            close = difflib.get_close_matches(str(name), FAMILIES, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            return ("families" if name in families else "family_shares",
                    f"unknown attack family {name!r}{hint}; known: {', '.join(FAMILIES)}")
    if len(set(families)) != len(families):
        return "families", f"names a family twice: {families}"
    for name, share in shares.items():
        if name not in families:
            return "family_shares", f"{name} has a share but is not in families ({', '.join(families) or 'none'})"
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            return "family_shares", f"{name}: a share of the budget is a number in (0, 1], got {share!r}"
    if sum(shares.values()) > 1 + 1e-9:
        return "family_shares", f"the shares add up to {sum(shares.values()):g}, more than the whole budget (1)"
    return None


def check_specs(data: dict[str, Any], origins: Origins) -> None:
    """Operator and constraint specs name registered classes and settings their constructors take; the searched
    families are known ones with shares that fit in the budget."""
    from flexsearch.attacks import CONSTRAINTS, OPERATORS
    from flexsearch.engine.methods import SEARCH_METHODS
    from flexsearch.objectives import OBJECTIVES

    shares = data.get("family_shares", {})
    if not isinstance(shares, dict):
        raise origins.error("family_shares", f"expected a mapping of family to share, got {shares!r}")
    refused = family_problem(list(data.get("families", FAMILIES)), shares)
    if refused:
        raise origins.error(*refused)
    if not 0 <= data.get("family_share", 0) <= 1:
        raise origins.error("family_share", f"a share of the candidates is a number in [0, 1], got "
                                            f"{data['family_share']}")

    for key, names in (("method", SEARCH_METHODS), ("objective", OBJECTIVES)):
        if key in data:
            try:
                names.get(data[key])
            except FlexsearchError as err:
                raise origins.error(key, str(err)) from None
    if "operators" in data and not data["operators"]:
        raise origins.error("operators", "a search needs at least one operator (none would try no attack at all)")
    for kind, registry in (("operators", OPERATORS), ("constraints", CONSTRAINTS)):
        for position, spec in enumerate(data.get(kind, [])):
            where = f"{kind}[{position}]"
            if isinstance(spec, str):
                spec = {"name": spec}
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise origins.error(kind, f"{where}: expected a name or a mapping with 'name', got {spec!r}")
            try:
                cls = registry.get(spec["name"])
            except FlexsearchError as err:
                raise origins.error(kind, f"{where}: {err}") from None
            try:
                hints = typing.get_type_hints(cls.__init__)
            except NameError:  # an annotation only importable for type checkers: check names, not types
                hints = {}
            takes = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "resources")]
            for setting, value in spec.items():
                if setting == "name":
                    continue
                if setting not in takes:
                    raise origins.error(kind, f"{where} ({spec['name']}): unknown setting '{setting}'; "
                                              f"known: {', '.join(takes) or 'none'}")
                problem = _type_error(value, hints.get(setting))
                if not problem and isinstance(value, float) and not math.isfinite(value):
                    problem = f"must be a finite number, got {value}"
                if problem:
                    raise origins.error(kind, f"{where} ({spec['name']}).{setting}: {problem}")
            # an operator or constraint may say why its settings' values cannot work, before any model loads
            settings_problem = getattr(cls, "settings_problem", None)
            problem = settings_problem(**{k: v for k, v in spec.items() if k != "name"}) if settings_problem else None
            if problem:
                raise origins.error(kind, f"{where} ({spec['name']}): {problem}")


def prompts_per_candidate(average_orders: bool) -> int:
    """Queries one candidate costs: one prompt per option order scored (the three cyclic orders, or one)."""
    return 3 if average_orders else 1


def least_budget(config: SearchConfig, per_prompt: int = 1, items: Sequence[Item] = ()) -> tuple[int, str]:
    """The least budget that reaches one attack on every item, and why (DESIGN.md "Budget unit"): the clean prompt
    and one candidate, each one query per option order scored (times the samples of a served sample mode,
    `per_prompt`); a greedy search with leave-one-out importance and word operators alone first scores one probe
    per editable word, so the item with the fewest sets its floor (known once the data is, `items`)."""
    from flexsearch.attacks import OPERATORS
    from flexsearch.attacks.constraints import editable_positions

    cost = prompts_per_candidate(config.scoring.average_orders) * per_prompt
    samples = ", times the samples each prompt is scored" if per_prompt > 1 else ""
    queries = f"{cost} quer{'y' if cost == 1 else 'ies'}"
    least, why = 2 * cost, (f"each candidate costs {queries} (one per option order scored{samples}), so the clean "
                            f"prompt alone takes {queries}")
    word_only = all(OPERATORS.get(spec["name"]).edits_words for spec in config.operators)
    if config.method == "greedy" and config.importance == "leave_one_out" and word_only and items:
        fewest = min(len(editable_positions(Candidate.root(it))) for it in items)
        if cost * (fewest + 2) > least:  # the clean prompt, the probes, one edit
            least, why = cost * (fewest + 2), (f"greedy word importance first scores one probe per editable word "
                                               f"({fewest} or more per item, {cost} queries each)")
    return least, why


def check_budget(config: SearchConfig, origins: Origins | None = None, per_prompt: int = 1,
                 items: Sequence[Item] = ()) -> None:
    """The one budget check: when the config is built (`origins` names the line that set it) and again once the
    data and the target's cost per prompt are known."""
    least, why = least_budget(config, per_prompt, items)
    if config.budget < least:
        message = f"{config.budget} cannot reach any operator: {why}; give at least {least}"
        raise origins.error("budget", message) if origins else FlexsearchError(f"--budget {message}")


def _build(cls: type, data: dict[str, Any], origins: Origins) -> Any:
    check_settings(cls, data, origins)
    check_specs(data, origins)
    values = dict(data)
    if isinstance(values.get("scoring"), dict):
        values["scoring"] = ScoringConfig(**values["scoring"])
    config = cls(**values)
    if config.scoring.slot == "system" and config.scoring.mode != "chat":
        raise origins.error("scoring.slot", SYSTEM_NEEDS_CHAT)
    check_budget(config, origins)
    return config


def check_method_settings(config: SearchConfig, origins: Origins) -> None:
    """A setting given by --set that this search's method never reads is refused, not ignored: a user who sets
    `beam_width` on the learned search would otherwise read a run as if it had taken effect."""
    from flexsearch.engine.methods import SEARCH_METHODS, readers

    for key in sorted({setting for name in SEARCH_METHODS for setting in SEARCH_METHODS.get(name).reads}):
        methods = readers(key)
        if origins.by_override(key) and config.method not in methods:
            named = f" {methods[0]}" if len(methods) == 1 else f"s {', '.join(methods[:-1])} and {methods[-1]}"
            raise origins.error(key, f"is read by method{named} only; this search's method is {config.method}, "
                                     "which would ignore it")


def apply_override(data: dict[str, Any], assignment: str) -> str:
    """'scoring.batch_size=8' → data['scoring']['batch_size'] = 8 (the value is parsed as YAML);
    returns the dotted key."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise FlexsearchError(f"--set expects key=value, got {assignment!r}")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise FlexsearchError(f"--set {assignment}: '{part}' is not a group of settings")
    try:
        node[leaf] = safe_yaml(raw)
    except yaml.YAMLError as err:
        raise FlexsearchError(f"--set {assignment}: the value is not valid YAML "
                              f"({getattr(err, 'problem', None) or 'syntax error'})") from None
    return key.strip()


SCORING_OPTION = "scoring_"  # the keyword of a scoring setting given as a CLI option (scoring_slot: --slot)


def scoring_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """CLI options that are given (not None), split into top-level settings and scoring settings."""
    given = {k: v for k, v in options.items() if v is not None}
    scoring = {k.removeprefix(SCORING_OPTION): given.pop(k) for k in list(given) if k.startswith(SCORING_OPTION)}
    return given, scoring


def load_config(preset: str | None = None, overrides: list[str] | None = None,
                **cli: Any) -> SearchConfig:
    """Defaults, then the YAML preset, then --set overrides, then explicit CLI options (not None).

    Every value is checked (type, range, registered names) before anything loads or is written."""
    data: dict[str, Any] = {}
    origins = Origins()
    if preset:
        path = preset_path(preset)
        loaded, lines = read_yaml(path)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise InputError(path, 1, None, "expected a mapping of settings")
        data.update(loaded)
        for key, line in lines.items():
            origins.set(key, f"{path}:{line}")
    for assignment in overrides or []:
        origins.set(apply_override(data, assignment), f"--set {assignment}")
    check_settings(SearchConfig, data, origins)  # a bad value is refused even where a CLI option overrides it
    given, scoring = scoring_options(cli)
    for key, value in given.items():
        data[key] = value
        origins.set(key, f"--{key.replace('_', '-')}")
    for setting, value in scoring.items():
        data.setdefault("scoring", {})[setting] = value
        origins.set(f"scoring.{setting}", f"--{setting.replace('_', '-')}")
    config: SearchConfig = _build(SearchConfig, data, origins)
    check_method_settings(config, origins)
    return config


def config_dict(config: SearchConfig) -> dict[str, Any]:
    return asdict(config)
