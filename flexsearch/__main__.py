"""`python -m flexsearch`: the same command line as `flexsearch`."""

from flexsearch.cli import app

app()
