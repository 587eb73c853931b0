"""The serve command: the HTTP translation server (conf/serve.yaml)."""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import OmegaConf

from litmt.deploy.access import AccessConfig, exposure_warning, load_keys
from litmt.deploy.server import ServeConfig, build_server_app
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


def serve(cfg: Any) -> None:
    """The `scripts/serve.py` job: load ``cfg.model_path``, serve on ``cfg.host``:``cfg.port``.

    (``model_path``, not ``model``: ``model=`` would select a file of the ``conf/model/`` group.)
    """
    import uvicorn

    if not cfg.get("model_path"):
        raise ConfigError(
            "no model given: pass model_path=<a .ckpt file or a CTranslate2 export directory>"
        )
    # first: a bad limit or decoding option is one line and exit 2, before the model loads
    settings = ServeConfig(
        max_batch_texts=int(cfg.max_batch_texts),
        max_wait_ms=float(cfg.max_wait_ms),
        max_queue=int(cfg.max_queue),
        request_timeout_s=float(cfg.request_timeout_s),
        retry_after_s=int(cfg.retry_after_s),
        max_texts=int(cfg.max_texts),
        max_chars=int(cfg.max_chars),
        max_text_chars=int(cfg.max_text_chars),
        max_lines=int(cfg.max_lines),
        max_source_tokens=int(cfg.max_source_tokens),
        split_sentences=str(cfg.split_sentences),
        allow_zero_shot=bool(cfg.get("allow_zero_shot") or False),
        max_body_bytes=int(cfg.max_body_bytes),
        attention_max_tokens=int(cfg.attention_max_tokens),
        cors=OmegaConf.to_object(cfg.cors) if OmegaConf.is_config(cfg.cors) else cfg.cors,
        access=AccessConfig(
            api_keys_file=cfg.api_keys_file,
            api_keys_env=cfg.api_keys_env,
            require_api_key=bool(cfg.require_api_key),
            require_api_key_origin=cfg.require_api_key_origin,
            req_limit=int(cfg.req_limit),
            trust_forwarded_for=bool(cfg.trust_forwarded_for),
        ),
        decoding={**cfg.decoding, "max_tokens": int(cfg.max_tokens)},
    )
    warning = exposure_warning(cfg.host, keys_on=bool(load_keys(settings.access)))
    if warning:  # before the model loads; a missing key file is one line and exit 2 here too
        log.warning(warning)
    app = build_server_app(
        str(cfg.model_path),
        engine=str(cfg.engine),
        device=cfg.get("device"),
        threads=int(cfg.threads),
        attention=bool(cfg.explorer),
        settings=settings,
        cache_dir=cfg.get("ct2_cache"),
        quantization=str(cfg.get("quantization") or "none"),
        compute_type=str(cfg.get("compute_type") or "default"),
    )
    log.info("serving %s on http://%s:%d", cfg.model_path, cfg.host, int(cfg.port))
    limit = cfg.get("limit_concurrency")
    uvicorn.run(
        app,
        host=str(cfg.host),
        port=int(cfg.port),
        log_level=str(cfg.log_level),
        limit_concurrency=int(limit) if limit else None,  # over it: 503 from uvicorn itself
        timeout_graceful_shutdown=float(cfg.timeout_graceful_shutdown),  # SIGTERM: drain
    )
