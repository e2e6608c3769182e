"""The search-method seam: a method is a class with a `search` generator, registered by name; a new method is one file
in this folder that registers itself (and a line in methods/__init__.py that imports it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

from flexsearch.registry import Registry

if TYPE_CHECKING:
    from flexsearch.engine.state import ItemState, SearchContext, SearchMethod


class Method(Protocol):
    """A search method: `search` yields Requests of candidates to score and receives their answer distributions."""

    name: ClassVar[str]
    # settings that only some methods read, this one among them (config refuses a --set of one its method ignores)
    reads: ClassVar[tuple[str, ...]]

    @staticmethod
    def search(ctx: SearchContext, state: ItemState) -> SearchMethod: ...


SEARCH_METHODS: Registry[Method] = Registry("search method")


def readers(setting: str) -> list[str]:
    """The registered methods that read `setting`, as their `reads` declare (config.check_method_settings
    names them)."""
    return [name for name in SEARCH_METHODS if setting in SEARCH_METHODS.get(name).reads]
