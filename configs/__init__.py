"""Preset search configurations (YAML), installed as flexsearch.configs."""
