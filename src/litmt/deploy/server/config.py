"""`ServeConfig`: every setting of the HTTP server, validated, with its one default and doc.

Each field's docstring is its one documentation; ``conf/serve.yaml`` lists the fields set to
their real defaults with that doc as their comment (`litmt.config.render_yaml`), and
`tests/unit/test_config_defaults.py` fails when the two differ. ``scripts/serve.py`` builds
it from the composed config (`litmt.cli.serve`), `litmt.deploy.server.app.create_app` takes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from litmt.config import build, renamed_keys
from litmt.decoding.config import DecodeConfig, job_options
from litmt.decoding.search.stopping import DEFAULT_GRAIN
from litmt.deploy.server.access import AccessConfig
from litmt.deploy.server.input.sentences import MODES
from litmt.errors import ConfigError

POSITIVE = ("max_batch_sentences", "stop_grain_sentences", "max_texts", "max_chars", "max_text_chars", "max_lines",
            "max_source_tokens", "max_body_bytes", "max_queue", "attention_max_tokens",
            "max_constraints", "max_constraint_pieces")  # fmt: skip
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
# Old spellings of serve.yaml's server keys: each works for one release, with a deprecation line.
RENAMES = {"max_batch_texts": "max_batch_sentences"}
# The access keys sat at serve.yaml's top level before they had their own block.
MOVED_TO_ACCESS = tuple(f.name for f in dataclasses.fields(AccessConfig))
# Deprecated access keys that are no longer fields: AccessConfig reads them (an InitVar) and
# logs the deprecation line itself, since each means something new (see AccessConfig).
OLD_ACCESS = ("trust_forwarded_for",)


@dataclass
class ServeConfig:
    """The HTTP server's settings: limits, batching, uvicorn's options, operator controls
    (`access`) and the decoding options of every translation.

    The decoding options are validated here (`DecodeConfig.from_options`), so a bad one
    stops the server at startup with a `ConfigError`, never a 400 on each request.
    """

    host: str = "127.0.0.1"
    """interface to listen on; 0.0.0.0 = every interface"""
    port: int = 5000
    """TCP port"""
    log_level: str = "info"
    """uvicorn's log level: critical | error | warning | info | debug"""
    limit_concurrency: int = 512
    """open connections at most; a connection past it gets 503 {"error": ...} with
    Retry-After and is closed (litmt.deploy.server.protocol); 0 = no limit"""
    max_connections_per_client: int = 32
    """open connections one client address may hold (access.forwarded_allow_ips, your
    proxies, are exempt); past it: 429 {"error": ...} with Retry-After; 0 = no cap"""
    header_timeout_s: float = 10.0
    """a request's headers must arrive within this many seconds of its first byte (a new
    connection: of its opening), else 408 and the connection is closed; 0 = no deadline"""
    body_timeout_s: float = 10.0
    """a request's body must arrive within this many seconds once its headers are in, else
    408 and the connection is closed; 0 = no deadline"""
    write_timeout_s: float = 30.0
    """an answer the client does not take: once the connection's write buffer is full, the
    client must read enough to drain it within this many seconds, else the connection is
    aborted and its slot and buffer freed; 0 = no deadline"""
    timeout_graceful_shutdown: float = 30.0
    """uvicorn: on SIGTERM, seconds in-flight requests get to finish"""
    max_batch_sentences: int = 64
    """dynamic batching: most sentences decoded together (a larger request is a batch of its
    own)"""
    max_wait_ms: float = 10.0
    """dynamic batching: how long a batch's first request waits for company"""
    stop_grain_sentences: int = DEFAULT_GRAIN
    """a batch no client waits for any more stops: the torch and ONNX engines at their next
    decoder step, the ct2 engine (whose search cannot be interrupted) between sub-batches of
    at most this many sentences, which it then decodes one group at a time per thread"""
    max_queue: int = 512
    """requests waiting for the model (every kind: plain, alternatives, prefix/constraints,
    /attention); when full: 503 {"error": ...} with Retry-After. The default matches
    limit_concurrency, so overload is refused by request_timeout_s's estimate, not by count"""
    request_timeout_s: float = 60.0
    """a request's wait for its answer (queue + decoding), else 504; a request the work
    queued ahead would keep past it is refused at once: 503 with Retry-After"""
    retry_after_s: int = 1
    """the Retry-After header (seconds) of a 503"""
    max_texts: int = 64
    """most texts in one request's q list, else 413"""
    max_chars: int = 5000
    """most characters in one request (all texts of q together; litmt's own batch cap:
    LibreTranslate's char_limit is per text, see max_text_chars), else 413"""
    max_text_chars: int = 5000
    """most characters in one text of q, else 413"""
    max_lines: int = 100
    """most lines in one text (each line is a sentence to decode), else 413"""
    max_source_tokens: int = 4096
    """most subword tokens in one request (all lines), else 413"""
    split_sentences: str = "long"
    """long = a line over the model's source limit is split into sentences (sentencex) and
    rejoined; always = every line; never = such a line is a 413. A sentence still over the
    limit is a 413, never truncated"""
    allow_zero_shot: bool = False
    """a multilingual model: also serve directions it never trained on (e.g. de->fr), listed
    in /languages and logged as zero-shot"""
    max_body_bytes: int = 1_000_000
    """largest request body, else 413"""
    attention_max_tokens: int = 256
    """POST /attention: most source tokens (else 413) and target tokens"""
    max_constraints: int = 8
    """prefix/constraints: most constraint phrases of one sentence, else 400"""
    max_constraint_pieces: int = 32
    """prefix/constraints: most target pieces of all of one sentence's constraints together,
    else 400; a constrained sentence's beam is raised to its pieces + 1, so this also caps
    that beam (at max_constraint_pieces + 1)"""
    cors: bool | str | list[str] = False
    """browsers on other origins: false = same origin only (no CORS headers); "*" = any
    (LibreTranslate's); or a list [https://a.example, ...]"""
    access: AccessConfig = field(default_factory=AccessConfig)
    """operator controls (litmt.deploy.server.access; LibreTranslate's --api-keys, --req-limit)"""
    decoding: dict[str, Any] = field(default_factory=dict)
    """Translator.translate options of every translation: serve.yaml fills it from the
    decoding group and max_tokens; n_best is ignored"""

    def __post_init__(self) -> None:
        self._coerce_numbers()
        if isinstance(self.access, Mapping):  # a YAML block: absent keys keep their default
            old = {k: self.access[k] for k in OLD_ACCESS if self.access.get(k) is not None}
            values = {k: v for k, v in self.access.items() if k not in OLD_ACCESS}
            self.access = build(AccessConfig, values, "serve.access")
            if old:  # rebuilt with the old keys, which log their own deprecation line
                fields = {
                    f.name: getattr(self.access, f.name) for f in dataclasses.fields(AccessConfig)
                }
                self.access = AccessConfig(**fields, **old)
        for name in POSITIVE:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.split_sentences not in MODES:
            raise ConfigError(
                f"split_sentences must be one of {list(MODES)}, got {self.split_sentences!r}"
            )
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        for name in ("limit_concurrency", "max_connections_per_client"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (0 = no limit), got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "write_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"{name} must be >= 0 (0 = no deadline), got {getattr(self, name)}"
                )
        if str(self.log_level) not in LOG_LEVELS:
            raise ConfigError(
                f"log_level must be one of {list(LOG_LEVELS)}, got {self.log_level!r}"
            )
        try:
            DecodeConfig.from_options(self.decoding)
        except ConfigError as exc:
            raise ConfigError(f"decoding: {exc}") from None

    def _coerce_numbers(self) -> None:
        """The int and float fields as their type (a YAML 10 for a float; "5" from a quote)."""
        for f in dataclasses.fields(self):
            kind = {"int": int, "float": float}.get(str(f.type))
            value = getattr(self, f.name)
            if kind is None or type(value) is kind:
                continue
            try:
                setattr(self, f.name, kind(value))
            except (TypeError, ValueError):
                raise ConfigError(f"{f.name} must be a number, got {value!r}") from None


def old_serve_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """serve.yaml's composed keys ready for `build`: the old spellings of the access keys
    resolved, and the decoding block cut to the keys the job chose (`job_options`: the group
    lists every default, and a key that merely repeats one must not override an export's own
    decoding defaults).

    An old spelling left at null is dropped (serve.yaml lists each so that the command line
    accepts it); a flat access key that is set (``req_limit=7``) moves into the ``access``
    block with a deprecation line, replacing the block's key where that only shows its default.
    `RENAMES` are left to `build`; where an old spelling is set, its new key is dropped when it
    only shows its default (serve.yaml lists it), so ``max_batch_texts=3`` is not a conflict.

    Raises:
        ConfigError: an access key set under both its old and its new spelling.
    """
    old = (*RENAMES, *MOVED_TO_ACCESS, *OLD_ACCESS)
    out = {k: v for k, v in values.items() if not (k in old and v is None)}
    shown = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
    for old_key, new_key in RENAMES.items():
        if old_key in out and new_key in out and out[new_key] == shown.get(new_key):
            del out[new_key]
    if isinstance(out.get("decoding"), Mapping):
        decoding = dict(out["decoding"])
        others = {k: v for k, v in decoding.items() if k not in DecodeConfig.__dataclass_fields__}
        out["decoding"] = {**others, **job_options(decoding)}
    flat_old = {k: out.pop(k) for k in OLD_ACCESS if k in out}  # AccessConfig logs these
    if flat_old:
        out["access"] = {**(out.get("access") or {}), **flat_old}
    moved = [k for k in MOVED_TO_ACCESS if k in out]
    if moved and isinstance(out.get("access"), Mapping):
        defaults = AccessConfig()
        out["access"] = {
            k: v for k, v in out["access"].items() if not (k in moved and v == getattr(defaults, k))
        }
    return renamed_keys(out, {k: f"access.{k}" for k in MOVED_TO_ACCESS}, "serve")


__all__ = ["MOVED_TO_ACCESS", "OLD_ACCESS", "POSITIVE", "RENAMES", "ServeConfig", "old_serve_keys"]
