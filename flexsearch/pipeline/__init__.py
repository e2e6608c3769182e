"""The run pipeline behind the API and the CLI, one module per command: `search`, `evaluate`, `tune`, `mutate`;
`run.py` what they share (the run directory opened before the model loads, the scorer, the items that fit) and
`target.py` the target a run attacks."""
