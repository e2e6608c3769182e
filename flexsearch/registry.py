"""A small name → class registry with a decorator and did-you-mean errors."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from flexsearch.errors import FlexsearchError

T = TypeVar("T")
C = TypeVar("C", bound=type)


def summary(doc: str | None) -> str:
    """A docstring's first paragraph on one line (a sentence that wraps is kept whole)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


class Registry(Generic[T]):
    """Holds named classes of one kind (operators, constraints, objectives...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Registers a class under `name` (and sets its `name`); the protocol it must follow is the
        registry's T, which holds once the class has its name."""

        def decorator(cls: C) -> C:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = cls
            setattr(cls, "name", name)  # noqa: B010  (a class attribute the protocols declare)
            return cls

        return decorator

    def get(self, name: str) -> type[T]:
        if name not in self._entries:
            close = difflib.get_close_matches(name, list(self._entries), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            known = ", ".join(sorted(self._entries))
            raise FlexsearchError(f"unknown {self.kind} '{name}'.{hint} Known: {known}")
        return self._entries[name]

    def describe(self) -> dict[str, str]:
        """Name → the first paragraph of the class docstring as one line, for `flexsearch list`."""
        return {name: summary(cls.__doc__) for name, cls in sorted(self._entries.items())}

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries
