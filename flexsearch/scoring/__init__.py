"""Scoring a prompt: the `Scorer` (`scorer.py`: option orders, the run's prompt cache, the query count) over a
backend (`backends/`, one file each, registered by the model spec they serve); `model.py` loads any causal LM, its
aliases and the zoo's adapters."""
