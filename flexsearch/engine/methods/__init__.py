"""Search methods, one file each. Importing this package registers every built-in one."""

from flexsearch.engine.methods import beam, evolutionary, greedy, learned, random_search  # noqa: F401  (registration)
from flexsearch.engine.methods.base import SEARCH_METHODS, Method, readers

__all__ = ["SEARCH_METHODS", "Method", "readers"]
