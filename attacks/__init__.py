"""Mutation operators and constraints. Importing this package registers every built-in one."""

from flexsearch.attacks import bert_attack, constraints, suffix, templates, textbugger  # noqa: F401  (registration)
from flexsearch.attacks.base import CONSTRAINTS, OPERATORS, AttackResources, build

__all__ = ["CONSTRAINTS", "OPERATORS", "AttackResources", "build"]
