"""flexsearch: adversarial prompt search for LLM fairness robustness."""

__version__ = "0.1.0"
