"""A served target's options, declared once (`ServedFields`): their names, types, defaults, help and bounds, read
by the served backend, the typed API's `Target` (which inherits the fields) and the CLI's option panel
(`SERVED_OPTIONS`); `served_options` checks a target's values in one line each. No HTTP client is imported here, so
the CLI declares its options and `flexsearch --help` starts at once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from flexsearch.errors import FlexsearchError


@dataclass(frozen=True)
class BackendOption:
    """One option of a backend, declared once: the CLI's flag (`--` + name with dashes) and its help, the typed
    API's `Target` field and its default, and the bounds checked on every path in (CLI, API, Ray workers)."""

    name: str
    annotation: Any  # the type the CLI parses and Target declares
    default: Any
    help: str
    least: float | None = None
    most: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """Why `value` is out of bounds, or None."""
        if self.annotation is int and (not isinstance(value, int) or isinstance(value, bool)
                                       or (self.least is not None and value < self.least)):
            return f"must be a whole number of at least {self.least:g}"
        if self.annotation is float and self.least is not None:
            most = float("inf") if self.most is None else self.most
            if not isinstance(value, (int, float)) or not self.least <= value <= most:
                return (f"must be between {self.least:g} and {self.most:g}" if self.most is not None
                        else f"must be at least {self.least:g}")
        return None


SERVED_PREFIX = "openai:"
SERVED_PANEL = f"Served model (--model {SERVED_PREFIX}NAME; key from FLEXSEARCH_API_KEY or OPENAI_API_KEY)"
def _declared(default: Any, help: str, least: float | None = None, most: float | None = None) -> Any:
    """A ServedFields field: its default, and the CLI's help and the bounds as its metadata."""
    return field(default=default, metadata={"help": help, "least": least, "most": most})


@dataclass(frozen=True, kw_only=True)
class ServedFields:
    """The served model's options, declared once. api.Target inherits these fields (keyword-only, so its own stay
    positional and every field keeps its static type); SERVED_OPTIONS, the CLI's "Served model" panel, the defaults
    and the checks are read from them."""

    base_url: str | None = _declared(None, "The server's OpenAI-compatible /v1 root, e.g. http://127.0.0.1:8000/v1 "
                                     "(vLLM, llama.cpp, TGI...).")
    served_mode: str | None = _declared(None, "auto (default: probe the server, take the layout's logprob mode, else "
                                        "sample), logprobs (/completions top-k), chat-logprobs (/chat/completions "
                                        "top-k) or sample (n answers parsed).")
    top_logprobs: int = _declared(5, "Top-k logprobs asked for (at least 5 recommended; the server's maximum if "
                                  "smaller).", least=1)
    samples: int = _declared(8, "Answers sampled per prompt in sample mode (each counts against the budget).",
                             least=1)
    temperature: float = _declared(1.0, "Sampling temperature in sample mode.", least=0, most=2)
    concurrency: int = _declared(4, "Requests in flight at once.", least=1)
    request_timeout: float = _declared(60.0, "Seconds one request may take before it is retried.", least=0.1)
    retries: int = _declared(5, "Retries of a request (429, 5xx, connection errors, timeouts) with exponential "
                             "backoff and jitter.", least=0)
    request_cache: bool = _declared(True, "Keep replies in the on-disk request cache (a resumed or repeated run "
                                    "never pays twice).")


_SERVED_TYPES = get_type_hints(ServedFields)  # once: the annotations are strings (postponed evaluation)
SERVED_OPTIONS = tuple(BackendOption(f.name, _SERVED_TYPES[f.name], f.default, **f.metadata)
                       for f in fields(ServedFields))
SERVED_DEFAULTS: dict[str, Any] = {option.name: option.default for option in SERVED_OPTIONS}

SERVED_MODES = ("logprobs", "chat-logprobs", "sample")


AUTO = "auto"


PROBED = {"plain": ("logprobs", "sample"), "chat": ("chat-logprobs", "sample")}  # auto's order per prompt layout


def is_served(spec: str) -> bool:
    return spec.startswith(SERVED_PREFIX)


@dataclass(frozen=True)
class ServedOptions:
    """A served target as the user asked for it (checked by `served_options`)."""

    name: str  # the model name sent with every request (the part after "openai:")
    base_url: str  # ".../v1", no trailing slash, no user:password part
    mode: str  # logprobs | chat-logprobs | sample, or auto until the server is probed
    top_logprobs: int
    samples: int
    temperature: float
    concurrency: int
    request_timeout: float
    retries: int
    request_cache: bool

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc

    @property
    def queries_per_prompt(self) -> int:
        return self.samples if self.mode == "sample" else 1

    def result_settings(self) -> dict[str, Any]:
        """What decides the scores (recorded in config.yaml; a resume must match it)."""
        settings: dict[str, Any] = {"host": self.host, "mode": self.mode}
        if self.mode != "sample":
            settings["top_logprobs"] = self.top_logprobs
        if self.mode in ("sample", AUTO):
            settings.update(samples=self.samples, temperature=self.temperature)
        return settings


def served_options(target: dict[str, Any], scoring_mode: str) -> ServedOptions | None:
    """The served options of an api.Target's arguments, checked (one line per problem, before anything is
    written); None for an in-process model."""
    spec, base_url = target["model"], target.get("base_url")
    if not is_served(spec):
        for key, default in SERVED_DEFAULTS.items():
            if target.get(key, default) != default:
                raise FlexsearchError(f"--{key.replace('_', '-')} is for a served model: give --model "
                                      f"{SERVED_PREFIX}NAME (NAME as the server lists it) and --base-url")
        return None
    name = spec.removeprefix(SERVED_PREFIX)
    if not name:
        raise FlexsearchError(f"--model {spec}: give the served model's name after '{SERVED_PREFIX}'")
    if not base_url:
        raise FlexsearchError(f"--model {spec} needs --base-url, the server's /v1 root "
                              "(e.g. http://127.0.0.1:8000/v1)")
    settings = {key: target.get(key, default) for key, default in SERVED_DEFAULTS.items()}
    mode = settings["served_mode"] or AUTO
    if mode not in (AUTO, *SERVED_MODES):
        raise FlexsearchError(f"--served-mode: unknown mode '{mode}' (choose from {AUTO}, {', '.join(SERVED_MODES)})")
    layout = {"logprobs": "plain", "chat-logprobs": "chat"}.get(mode, scoring_mode)
    if layout != scoring_mode:
        fitting = "chat-logprobs" if scoring_mode == "chat" else "logprobs"
        raise FlexsearchError(f"--served-mode {mode} scores the {layout} prompt layout, but scoring.mode is "
                              f"{scoring_mode}: use --served-mode {fitting} or sample")
    for option in SERVED_OPTIONS:
        problem = option.problem(settings[option.name])
        if problem:
            raise FlexsearchError(f"{option.flag}: {problem}")
    return ServedOptions(name=name, base_url=check_base_url(base_url), mode=mode,
                         top_logprobs=settings["top_logprobs"], samples=settings["samples"],
                         temperature=float(settings["temperature"]), concurrency=settings["concurrency"],
                         request_timeout=float(settings["request_timeout"]), retries=settings["retries"],
                         request_cache=bool(settings["request_cache"]))


def check_base_url(url: str) -> str:
    """An http(s) URL whose path is an OpenAI-compatible /v1 root, without a trailing slash or credentials."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlexsearchError(f"--base-url {url}: give a full URL with its scheme, e.g. http://{url.lstrip('/')}"
                              if "://" not in url else f"--base-url {url}: not an http(s) URL")
    if parts.username or parts.password:
        raise FlexsearchError("--base-url: holds a user name or password; give the key in FLEXSEARCH_API_KEY instead")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        raise FlexsearchError(f"--base-url {url}: not an OpenAI-compatible /v1 root (it should end in /v1, e.g. "
                              f"{parts.scheme}://{parts.netloc}/v1)")
    if parts.query or parts.fragment:
        raise FlexsearchError(f"--base-url {url}: a /v1 root takes no query or fragment")
    return f"{parts.scheme}://{parts.netloc}{path}"
