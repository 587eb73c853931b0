"""The serve command: the HTTP translation server (conf/serve.yaml).

The server's keys are the fields of `litmt.deploy.server.config.ServeConfig` (their defaults
and docs live there); what to load comes from the shared load group (`LoadConfig`:
``ckpt_path``, ``device``; the load keys serve cannot honour are refused, `SERVE_IGNORES`).
"""

from __future__ import annotations

import logging
from typing import Any

from litmt.config import build, plain, renamed_keys
from litmt.deploy.loader import LoadConfig, engine_options
from litmt.deploy.server.access import exposure_warning, load_keys
from litmt.deploy.server.app import build_server_app
from litmt.deploy.server.config import RENAMES, ServeConfig, old_serve_keys
from litmt.deploy.server.protocol import uvicorn_options
from litmt.errors import ConfigError

log = logging.getLogger(__name__)

# serve.yaml's own keys that changed their name: the old spelling works for one release.
OLD_KEYS = {"model_path": "ckpt_path"}
# serve.yaml's keys that say what to load and how to decode, not how to serve (the engine
# keys are conf/engine/'s; max_tokens joins the decoding options).
NOT_SERVER_KEYS = ("ckpt_path", "device", "explorer", "max_tokens", "hydra", "engine",
                   "threads", "compute_type", "ct2_cache", "ct2_cache_dir", "quantization",
                   "run_dir", "average_last", "attention", "ensemble", "src_lang", "tgt_lang")  # fmt: skip
# The load keys (conf/load/default.yaml) serve does not read: set, each is one line and exit 2.
# allow_zero_shot is read, as the server's policy (ServeConfig.allow_zero_shot).
SERVE_IGNORES = ("run_dir", "average_last", "attention", "ensemble", "src_lang", "tgt_lang")


def serve_config(values: dict[str, Any]) -> ServeConfig:
    """The server's settings from serve.yaml's keys (null = ServeConfig's default); the old
    spellings work, with a deprecation line.

    Raises:
        ConfigError: a bad limit or decoding option, or an unknown key.
    """
    values = old_serve_keys(values)
    decoding = dict(values.get("decoding") or {})
    if values.get("max_tokens") is not None:  # a decoding option of Translator.translate
        decoding["max_tokens"] = int(values["max_tokens"])
    return build(
        ServeConfig,
        {**values, "decoding": decoding},
        "serve",
        renames=RENAMES,
        ignore=NOT_SERVER_KEYS,
    )


def serve(cfg: Any) -> None:
    """The `scripts/serve.py` job: load ``cfg.ckpt_path``, serve on ``host``:``port``."""
    import uvicorn

    values = plain(cfg)
    values = renamed_keys({k: v for k, v in values.items() if v is not None}, OLD_KEYS, "serve")
    load = LoadConfig.from_cfg(values, "serve", ignores=SERVE_IGNORES)
    if not load.ckpt_path:
        raise ConfigError(
            "no model given: pass ckpt_path=<a .ckpt file or a CTranslate2 export directory>"
        )
    if not isinstance(load.ckpt_path, str):
        raise ConfigError(
            f"serve takes one model, got ckpt_path={load.ckpt_path}; average the checkpoints "
            "first (scripts/average_checkpoints.py) or export them (scripts/export.py)"
        )
    # first: a bad limit or decoding option is one line and exit 2, before the model loads
    settings = serve_config(values)
    warning = exposure_warning(settings.host, keys_on=bool(load_keys(settings.access)))
    if warning:  # before the model loads; a missing key file is one line and exit 2 here too
        log.warning(warning)
    app = build_server_app(
        load.ckpt_path,
        device=load.device,
        explorer=bool(values.get("explorer", True)),
        settings=settings,
        **engine_options(cfg),
    )
    log.info("serving %s on http://%s:%d", load.ckpt_path, settings.host, settings.port)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # litmt's HTTP protocol: header/body deadlines, connections per address,
        # limit_concurrency, JSON refusals, no proxy headers (litmt.deploy.server.protocol)
        **uvicorn_options(settings),
    )
