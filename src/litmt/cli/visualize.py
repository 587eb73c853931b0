"""The visualize_attention command: attention heatmaps of a checkpoint (conf/visualize_attention.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig

from litmt.attention import backend_support
from litmt.decoding.analysis.attention_maps import KINDS, collect_attention, plot_attention
from litmt.deploy.loader import LoadConfig
from litmt.errors import ConfigError
from litmt.models import ATTENTION_SITES, Seq2SeqTransformer, TransformerConfig

log = logging.getLogger(__name__)

# conf/load keys the heatmaps do not read: the kernels are chosen per site
# (`restore_weight_kernels`), one model is drawn, and the sentence is the direction.
VISUALIZE_IGNORES = ("attention", "ensemble", "src_lang", "tgt_lang", "allow_zero_shot")


def restore_weight_kernels(model: Seq2SeqTransformer, trained: dict[str, Any]) -> None:
    """Give back the trained kernel of every site whose kernel returns its own weights.

    A model loaded with `math` everywhere builds on any machine; the sites trained with a
    fused exact kernel keep `math` (the same weights), the others (`local`, `sparse`,
    `linear`) get their own kernel back, since their weights differ from softmax attention.

    Args:
        model: the model, loaded with ``attention="math"``.
        trained: the checkpoint's model config dict.
    """
    attention = TransformerConfig.from_dict(trained).attention
    for site in ATTENTION_SITES:
        name, options = attention.backend(site)
        if backend_support(name).weights and name != "math":
            log.info("heatmaps at %s: the model's own '%s' weights", site, name)
            model.set_attention_backend(name, site, **options)


def visualize(cfg: DictConfig) -> list[Path]:
    """The `scripts/visualize_attention.py` job: save PNG heatmap(s) of one sentence.

    Returns:
        The PNG paths written (one per kind; with several kinds, ``out`` gets a ``_<kind>``
        suffix).
    """
    from litmt.checkpoint.load import load_model

    load = LoadConfig.from_cfg(cfg, "visualize_attention", ignores=VISUALIZE_IGNORES)
    ckpt = load.paths()
    if not cfg.get("sentence") or not str(cfg.sentence).strip():
        raise ConfigError('no sentence given: pass sentence="A man is walking."')
    kinds = [str(k) for k in cfg.kind] if isinstance(cfg.kind, ListConfig) else [str(cfg.kind)]
    for kind in kinds:
        if kind not in KINDS:
            raise ConfigError(f"unknown attention kind '{kind}'; valid kinds: {', '.join(KINDS)}")
    loaded = load_model(ckpt, map_location=load.device, attention="math")
    restore_weight_kernels(loaded.model, loaded.meta["model_config"])
    maps = collect_attention(
        loaded.model, loaded.tokenizer, str(cfg.sentence), target=cfg.get("target")
    )
    layers = list(cfg.layers) if cfg.get("layers") is not None else None
    heads = list(cfg.heads) if cfg.get("heads") is not None else None
    figsize = tuple(float(v) for v in cfg.figsize) if cfg.get("figsize") is not None else None
    out = Path(str(cfg.out))
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds:
        fig = plot_attention(
            maps,
            kind,
            layers=layers,
            heads=heads,
            grid=bool(cfg.grid),
            figsize=figsize,  # type: ignore[arg-type]
            dpi=int(cfg.dpi),
        )
        path = out if len(kinds) == 1 else out.with_name(f"{out.stem}_{kind}{out.suffix}")
        fig.savefig(path, dpi=int(cfg.dpi), format="png")
        w, h = fig.get_size_inches() * int(cfg.dpi)
        log.info("wrote %s (%dx%d px): %s", path, round(w), round(h), maps.translation)
        written.append(path)
    return written
