"""Fine-tuning: start a training run from another checkpoint's weights and tokenizer.

`python scripts/train.py init_from=CKPT data=...` builds the model, loads CKPT's weights into
it and trains with a fresh optimizer, LR schedule and step count (only the weights are read:
the run is a new run, not a resume). The data module reuses CKPT's tokenizer, byte for byte,
instead of training one on the new corpus, so the ids keep their meaning. CKPT may also be a
transformers Marian directory (e.g. an OPUS-MT model saved with ``save_pretrained``), read
through `litmt.checkpoint.hf_import` the way ``scripts/import_hf.py`` imports it.

The architecture (`finetune.model_config`):

- ``checkpoint`` (default): CKPT's own model config; only the settings that do not change the
  weights (dropout rates, attention kernels: `litmt.checkpoint.compat.RUNTIME_KEYS`) come from
  `model`, and the other `model` keys that differ from CKPT's are listed in the log.
- ``config``: the run's `model` config; its weights must have CKPT's shapes, else a one-line
  error names the first parameter that differs.

The choice depends on the composed config only (`finetune.model_config`), never on where a
`model` key was set: the command line, an experiment file and a `model` group file are alike.
(The former ``auto`` mode picked ``config`` when the command line set a `model` key; it is
now a one-line error naming ``finetune.model_config=config``.)

Many languages (`data.directions`): the checkpoint's tokenizer must already hold every
direction's ``<2xx>`` tag as one piece (a multilingual litmt checkpoint does); a one-pair or
imported checkpoint's does not, and the run is refused at setup with one line naming the
missing tags (`check_language_tags`), rather than failing after training starts.

Freezing (`finetune.freeze`): parameter groups that keep their initial values. A parameter
belongs to the group of its first name in `named_parameters()`, so a tied output projection
(`tie_output`) is part of ``embeddings``; an untied one belongs to ``decoder``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from litmt.checkpoint.compat import RUNTIME_KEYS, config_differences
from litmt.checkpoint.hf_import import is_hf_dir, read_hf_dir
from litmt.checkpoint.io import META_KEY, load_checkpoint, model_state_dict
from litmt.data.directions import Direction
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import CheckpointError, ConfigError
from litmt.models import Seq2SeqTransformer

log = logging.getLogger(__name__)

MODEL_CONFIG_MODES = ("checkpoint", "config")

# Parameter-name prefixes of each freezable group (names as in `Seq2SeqTransformer`).
FREEZE_GROUPS: dict[str, tuple[str, ...]] = {
    "embeddings": ("src_embed.", "tgt_embed.", "src_pos.", "tgt_pos."),
    "encoder": ("encoder_layers.", "encoder_norm."),
    "decoder": ("decoder_layers.", "decoder_norm.", "output_proj."),
}


@dataclass
class InitCheckpoint:
    """What fine-tuning reads from the checkpoint it starts from.

    Attributes:
        path: the checkpoint file.
        weights: its model state dict (the ``model.`` prefix stripped).
        model_config: its `TransformerConfig` as a dict.
        tokenizer: its tokenizer (the exact bytes it was trained with).
        src_lang, tgt_lang: its translation direction.
    """

    path: str
    weights: dict[str, Tensor]
    model_config: dict[str, Any]
    tokenizer: Tokenizer
    src_lang: str
    tgt_lang: str


def read_init_checkpoint(path: str | Path) -> InitCheckpoint:
    """Load the checkpoint fine-tuning starts from (safely: ``weights_only``): a litmt
    checkpoint, or a transformers Marian directory (`litmt.checkpoint.hf_import`).

    Raises:
        CheckpointError: missing, corrupt or not a litmt checkpoint.
    """
    if is_hf_dir(path):
        imported = read_hf_dir(path)
        return InitCheckpoint(
            path=str(path),
            weights=imported.weights,
            model_config=imported.config.to_dict(),
            tokenizer=imported.tokenizer,
            src_lang=imported.src_lang,
            tgt_lang=imported.tgt_lang,
        )
    ckpt = load_checkpoint(path)
    meta = ckpt[META_KEY]
    return InitCheckpoint(
        path=str(path),
        weights=model_state_dict(ckpt),
        model_config=dict(meta["model_config"]),
        tokenizer=Tokenizer.from_dict(meta["tokenizer"]),
        src_lang=str(meta["src_lang"]),
        tgt_lang=str(meta["tgt_lang"]),
    )


def model_config(init: InitCheckpoint, requested: dict[str, Any], mode: str) -> dict[str, Any]:
    """The model config of a run that starts from `init`.

    Args:
        init: the checkpoint.
        requested: the run's own model config (`litmt.cli.train.model_config_dict`).
        mode: ``checkpoint`` or ``config`` (`finetune.model_config`; see the module docstring).

    Raises:
        ConfigError: an unknown mode.
    """
    if mode == "auto":
        raise ConfigError(
            "finetune.model_config=auto was removed: the default is the checkpoint's "
            "architecture; pass finetune.model_config=config to build `model` instead"
        )
    if mode not in MODEL_CONFIG_MODES:
        raise ConfigError(
            f"finetune.model_config={mode!r} is not one of {', '.join(MODEL_CONFIG_MODES)}"
        )
    if mode == "config":
        # same shapes can still mean other computations (activation, norm placement...)
        diffs = config_differences(init.model_config, requested)
        if diffs:
            shown = ", ".join(f"{k}: {a} -> {b}" for k, a, b in diffs)
            log.warning("init_from: the model differs from %s's in %s", init.path, shown)
        return requested
    config = dict(init.model_config)
    for key in RUNTIME_KEYS:
        if key in requested:
            config[key] = requested[key]
    ignored = config_differences(config, requested)
    if ignored:
        shown = ", ".join(f"{k}: {b} (kept {a})" for k, a, b in ignored)
        log.info("init_from: `model` keys not used (the checkpoint's architecture): %s", shown)
    log.info(
        "init_from: the architecture of %s (d_model=%s, %s+%s layers); dropout and attention "
        "kernels from `model` (finetune.model_config=config builds `model` instead)",
        init.path, config.get("d_model"), config.get("n_encoder_layers"),
        config.get("n_decoder_layers"),
    )  # fmt: skip
    return config


def load_weights(model: Seq2SeqTransformer, init: InitCheckpoint) -> None:
    """Copy `init`'s weights into `model` (every parameter and persistent buffer).

    Raises:
        CheckpointError: one line naming the first parameter whose shape differs (with both
            shapes), or that only one side has.
    """
    target = model.state_dict()
    fix = "use its architecture (finetune.model_config=checkpoint) or matching model.* settings"
    for name, tensor in target.items():
        if name not in init.weights:
            raise CheckpointError(
                f"init_from={init.path} has no parameter {name} (another architecture); {fix}"
            )
        have = init.weights[name]
        if have.shape != tensor.shape:
            raise CheckpointError(
                f"init_from={init.path}: parameter {name} has shape {tuple(have.shape)} in the "
                f"checkpoint but {tuple(tensor.shape)} in this model; {fix}"
            )
    extra = [k for k in init.weights if k not in target]
    if extra:
        raise CheckpointError(
            f"init_from={init.path} has parameter {extra[0]} that this model lacks "
            f"(another architecture); {fix}"
        )
    model.load_state_dict(init.weights)
    log.info("init_from: loaded the weights of %s", init.path)


def freeze(model: Seq2SeqTransformer, groups: Iterable[str]) -> list[str]:
    """Stop gradients to the parameters of `groups` (names of `FREEZE_GROUPS`).

    The optimizer skips parameters without a gradient (torch.optim.AdamW, `Adam._init_group`
    in torch/optim/adam.py: ``if p.grad is not None``), weight decay included, so frozen
    weights keep their values exactly.

    Returns:
        The names of the frozen parameters.

    Raises:
        ConfigError: an unknown group, or nothing left to train.
    """
    groups = [str(g) for g in groups]
    if unknown := [g for g in groups if g not in FREEZE_GROUPS]:
        raise ConfigError(
            f"finetune.freeze: unknown group {unknown[0]!r}; choose from {', '.join(FREEZE_GROUPS)}"
        )
    if not groups:
        return []
    prefixes = tuple(p for g in groups for p in FREEZE_GROUPS[g])
    frozen = []
    params = list(model.named_parameters())  # tied weights once, under their first name
    for name, param in params:
        if name.startswith(prefixes):
            param.requires_grad_(False)
            frozen.append(name)
    if len(frozen) == len(params):
        raise ConfigError(f"finetune.freeze={groups} leaves no parameter to train")
    names = set(frozen)
    n_frozen = sum(p.numel() for n, p in params if n in names)
    n_all = sum(p.numel() for _, p in params)
    log.info("frozen: %s (%d of %d weights)", ", ".join(groups), n_frozen, n_all)
    return frozen


def check_direction(init: InitCheckpoint, src_lang: str, tgt_lang: str) -> None:
    """Log a warning when the new data translates another direction than the checkpoint."""
    if (init.src_lang, init.tgt_lang) != (src_lang, tgt_lang):
        log.warning(
            "init_from: %s translates %s->%s, the new data %s->%s",
            init.path, init.src_lang, init.tgt_lang, src_lang, tgt_lang,
        )  # fmt: skip


def check_language_tags(
    init: InitCheckpoint, directions: Sequence[Direction], placement: str
) -> None:
    """Refuse `data.directions` when `init`'s tokenizer lacks their language tags.

    A one-pair or imported checkpoint's tokenizer does not hold ``<2xx>`` as one piece: the
    tag would be split into pieces and training would fail later (a ``KeyError`` for the
    forced first target token, an ``AssertionError`` for a source tag). Adding the tags would
    mean new sentencepiece pieces and new embedding rows; litmt refuses instead, at setup.

    Args:
        init: the checkpoint fine-tuning starts from.
        directions: `data.directions` ([] for a one-pair run: nothing to check).
        placement: `data.tag_placement` (``source``: the source vocabulary needs the tags;
            ``target``: the target vocabulary).

    Raises:
        ConfigError: one line naming the missing tags and what to do instead.
    """
    if not directions:
        return
    tok = init.tokenizer
    have = tok.tgt_tags if placement == "target" else tok.src_tags
    missing = [t for t in dict.fromkeys(d.tag for d in directions) if t not in have]
    if missing:
        side = "target" if placement == "target" else "source"
        raise ConfigError(
            f"init_from={init.path}: its tokenizer lacks the language tags "
            f"{', '.join(missing)} that data.directions with data.tag_placement={placement} "
            f"needs as {side} pieces; start from a multilingual litmt checkpoint trained with "
            f"these directions, or train from scratch (drop init_from)"
        )


def freeze_groups(finetune_cfg: Any) -> Sequence[str]:
    """`finetune.freeze` as a list (absent or null: none)."""
    if not finetune_cfg:
        return []
    value = finetune_cfg.get("freeze") or []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


# -- the hooks `litmt.cli.train.train` calls ---------------------------------------------------
def _absolute(path: str) -> str:
    """Relative to the launch directory (Hydra's original working directory, if any)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import to_absolute_path

    return to_absolute_path(path) if HydraConfig.initialized() else path


def setup_init_from(cfg: Any, datamodule: Any) -> InitCheckpoint | None:
    """`init_from`: read the checkpoint and make `datamodule` reuse its tokenizer.

    Call before the data is prepared. Returns None when `cfg.init_from` is not set.

    Raises:
        CheckpointError: the checkpoint cannot be read.
        ConfigError: `data.tokenizer.model` names another tokenizer than the checkpoint's, or
            the tokenizer lacks the language tags of `data.directions`
            (`check_language_tags`).
    """
    path = cfg.get("init_from")
    if not path:
        return None
    init = read_init_checkpoint(_absolute(str(path)))
    given = getattr(datamodule, "given_tokenizer", None)
    if given is not None and given.to_dict() != init.tokenizer.to_dict():
        raise ConfigError(
            f"data.tokenizer.model and init_from={path} name different tokenizers; drop "
            f"data.tokenizer.model (init_from reuses the checkpoint's tokenizer)"
        )
    languages = datamodule.languages_meta() if hasattr(datamodule, "languages_meta") else {}
    placement = str(languages.get("tag_placement", "source"))
    check_language_tags(init, getattr(datamodule, "directions", []), placement)  # before data
    datamodule.use_tokenizer(init.tokenizer, f"init_from={path}")
    check_direction(init, datamodule.src_lang, datamodule.tgt_lang)
    return init


def model_config_for(cfg: Any, init: InitCheckpoint | None, requested: dict[str, Any]) -> dict:
    """The run's model config: `requested`, or under `init_from` `model_config(...)`."""
    if init is None:
        return requested
    return model_config(init, requested, str(cfg.finetune.model_config))


def prepare_model(model: Seq2SeqTransformer, init: InitCheckpoint | None, cfg: Any) -> None:
    """Load `init`'s weights (if any) and freeze the groups `cfg.finetune.freeze` names."""
    if init is not None:
        load_weights(model, init)
    freeze(model, freeze_groups(cfg.get("finetune")))
