"""Scoring backends, one file each: `in_process` (a transformers model in this process, white-box) and `served`
(any OpenAI-compatible server, black-box; its options in `served_options`, its HTTP client, request cache, usage
and answer parsing beside it). A backend registers itself in `base.BACKENDS` under the model-spec prefix it serves;
`REGISTERED` lists the modules that register one (imported when a backend is built or listed, not with this
package, so the CLI's option declarations stay light)."""

REGISTERED = ("flexsearch.scoring.backends.in_process", "flexsearch.scoring.backends.served")
