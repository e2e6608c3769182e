"""The operator and constraint protocols and their registries.

An operator proposes new candidates from one candidate; a constraint accepts or rejects proposed
candidates. Add an operator by writing one class in this folder and decorating it with
`@OPERATORS.register("name")`; its constructor's keyword arguments are its YAML settings. A class may also
define a static `settings_problem(**settings) -> str | None`: the config check calls it, so a value that
cannot work is refused before any data or model loads; and a static `availability_problem(**settings)`, which
a search calls before the target model loads, for what the machine must provide (a masked LM, say); and a
static `white_box_problem(**settings)` when some settings read the target's weights (a served target refuses
them; an operator with `needs_gradient` is refused without one). An operator whose proposals come from a finite
library (the templates) also defines `enumerate(candidate)`, every proposal in library order, and `arms()`, the
learner's key of each (DESIGN.md "The learner"): the learned search ranks them all instead of sampling.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import numpy as np

from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, render
from flexsearch.errors import FlexsearchError
from flexsearch.objectives import Objective
from flexsearch.registry import Registry

if TYPE_CHECKING:  # torch comes with these; white-box work imports them where it happens
    from flexsearch.attacks.gradient import PromptGradient
    from flexsearch.scoring.model import TargetModel

Position = tuple[str, int]  # (field, word index)
GRADIENT_CACHE = 256  # prompts whose gradient is kept (a beam re-expands its parents)


def refuse_settings(name: str, problem: str | None) -> None:
    """Raises an operator's settings_problem when it is built directly (the config check reports it earlier)."""
    if problem:
        raise FlexsearchError(f"{name}: {problem}")


@dataclass
class AttackResources:
    """What operators and constraints may draw on besides their own settings."""

    target: TargetModel | None = None  # the white-box target (embedding neighbours, gradients)
    fmt: PromptFormat = field(default_factory=PromptFormat)
    objective: Objective | None = None  # the objective being searched (what gradients point toward)
    gradient_passes: int = 0  # forward+backward passes over one prompt; the search charges them to the item
    _gradients: OrderedDict[str, PromptGradient] = field(default_factory=OrderedDict, repr=False)

    def white_box(self) -> TargetModel:
        """The loaded target model; a served target has none (its white-box options are refused earlier)."""
        if self.target is None:
            raise FlexsearchError("this needs a white-box target model loaded in process, not a served one")
        return self.target

    def gradient(self, candidate: Candidate) -> PromptGradient:
        """The objective's input-embedding gradient on the candidate's prompt; a prompt seen recently is
        served from a cache and costs nothing."""
        target = self.white_box()
        if self.objective is None:
            raise FlexsearchError("gradients need an objective")
        prompt = render(candidate, target.tokenizer, self.fmt)
        if prompt in self._gradients:
            self._gradients.move_to_end(prompt)
            return self._gradients[prompt]
        self.gradient_passes += 1
        from flexsearch.attacks.gradient import prompt_gradient

        result = self._gradients[prompt] = prompt_gradient(target, self.fmt, self.objective, candidate)
        if len(self._gradients) > GRADIENT_CACHE:
            self._gradients.popitem(last=False)
        return result


class Operator(Protocol):
    name: ClassVar[str]
    edits_words: ClassVar[bool]  # True: word edits at positions; False: instruction slots
    needs_gradient: ClassVar[bool]  # True: propose() takes a gradient pass (resources.gradient)

    def __init__(self, resources: AttackResources, **settings: Any) -> None: ...

    def propose(self, candidate: Candidate, rng: np.random.Generator,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
        """New candidates from `candidate` (each records its edit and parent). Word operators edit the
        given positions, or positions they pick themselves when None."""
        ...


class Constraint(Protocol):
    name: ClassVar[str]

    def __init__(self, resources: AttackResources, **settings: Any) -> None: ...

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]: ...


OPERATORS: Registry[Operator] = Registry("operator")
CONSTRAINTS: Registry[Constraint] = Registry("constraint")


T = TypeVar("T", Operator, Constraint)


def availability_problems(specs: list[dict[str, Any]]) -> list[str]:
    """What the machine lacks for these operator specs (each operator's availability_problem), as lines."""
    problems = []
    for spec in specs:
        cls = OPERATORS.get(spec["name"])
        check = getattr(cls, "availability_problem", None)
        problem = check(**{k: v for k, v in spec.items() if k != "name"}) if check else None
        if problem:
            problems.append(f"{spec['name']}: {problem}")
    return problems


def white_box_problems(specs: list[dict[str, Any]]) -> list[str]:
    """Why these operator specs need the target's weights (gradients, or the operator's own static
    `white_box_problem(**settings)`), as lines; a served target refuses them."""
    problems = []
    for spec in specs:
        cls = OPERATORS.get(spec["name"])
        check = getattr(cls, "white_box_problem", None)
        problem = ("takes gradients of the target's weights (white-box only)" if cls.needs_gradient
                   else check(**{k: v for k, v in spec.items() if k != "name"}) if check else None)
        if problem:
            problems.append(f"operator {spec['name']}: {problem}")
    return problems


def build(registry: Registry[T], spec: dict[str, Any] | str, resources: AttackResources) -> T:
    """An operator or constraint from its YAML spec: a name, or {name: ..., setting: value...}."""
    settings = {"name": spec} if isinstance(spec, str) else dict(spec)
    cls = registry.get(settings.pop("name"))
    try:
        return cls(resources=resources, **settings)
    except TypeError as err:
        raise FlexsearchError(f"{registry.kind} '{cls.name}': bad settings {settings} ({err})") from None
