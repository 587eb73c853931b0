"""The visualize_attention command: attention heatmaps of a checkpoint (conf/visualize_attention.yaml)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from litmt.attention import backend_support
from litmt.config import job_config
from litmt.decoding.analysis.attention_maps import KINDS, collect_attention, plot_attention
from litmt.deploy.loader import LoadConfig
from litmt.errors import ConfigError
from litmt.models import ATTENTION_SITES, Seq2SeqTransformer, TransformerConfig

log = logging.getLogger(__name__)

# conf/load keys the heatmaps do not read: the kernels are chosen per site
# (`restore_weight_kernels`), one model is drawn, and the sentence is the direction.
VISUALIZE_IGNORES = ("attention", "ensemble", "src_lang", "tgt_lang", "allow_zero_shot")


@dataclass(frozen=True)
class VisualizeConfig:
    """The visualize_attention command's own keys (conf/visualize_attention.yaml's top level; the
    checkpoint and the device are the load group's)."""

    sentence: str | None = None
    """source sentence to visualise (required)"""
    target: str | None = None
    """target to force-decode; null = the model's own greedy translation"""
    kind: Any = "cross"
    """cross | encoder | decoder, or a list (then out gets a _<kind> suffix)"""
    layers: list[int] | None = None
    """layer indices, e.g. [0,5] or [-1]; null = the last layer"""
    heads: list[int] | None = None
    """head indices, e.g. [0,3]; null = all heads"""
    grid: bool = False
    """true: one panel per (layer, head); false: one panel, mean of the selection"""
    out: str = "attention.png"
    """PNG path"""
    figsize: list[float] | None = None
    """[width, height] in inches; null = sized from the number of tokens"""
    dpi: int = 100
    """PNG resolution: the image is figsize * dpi pixels"""

    def kinds(self) -> list[str]:
        """The kinds asked for, as a list.

        Raises:
            ConfigError: an unknown kind.
        """
        kinds = [str(k) for k in self.kind] if isinstance(self.kind, list) else [str(self.kind)]
        for kind in kinds:
            if kind not in KINDS:
                raise ConfigError(
                    f"unknown attention kind '{kind}'; valid kinds: {', '.join(KINDS)}"
                )
        return kinds


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
    settings = job_config(VisualizeConfig, cfg, "visualize_attention")
    if not settings.sentence or not str(settings.sentence).strip():
        raise ConfigError('no sentence given: pass sentence="A man is walking."')
    kinds = settings.kinds()
    loaded = load_model(ckpt, map_location=load.device, attention="math")
    restore_weight_kernels(loaded.model, loaded.meta["model_config"])
    maps = collect_attention(
        loaded.model, loaded.tokenizer, str(settings.sentence), target=settings.target
    )
    figsize = tuple(float(v) for v in settings.figsize) if settings.figsize is not None else None
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds:
        fig = plot_attention(
            maps,
            kind,
            layers=settings.layers,
            heads=settings.heads,
            grid=settings.grid,
            figsize=figsize,  # type: ignore[arg-type]
            dpi=settings.dpi,
        )
        path = out if len(kinds) == 1 else out.with_name(f"{out.stem}_{kind}{out.suffix}")
        fig.savefig(path, dpi=settings.dpi, format="png")
        w, h = fig.get_size_inches() * settings.dpi
        log.info("wrote %s (%dx%d px): %s", path, round(w), round(h), maps.translation)
        written.append(path)
    return written
