"""Export a litmt checkpoint as a transformers model directory: ``AutoModelForSeq2SeqLM``,
``AutoTokenizer`` and ``pipeline("translation", model=DIR)`` load it with no litmt code.

The class (each stock transformers class that computes a litmt model exactly):

- post-norm (``norm_first=false``) -> ``MarianMTModel``: post-norm layers, no final norms;
- pre-norm (``norm_first=true``) -> ``PegasusForConditionalGeneration``: pre-norm layers and
  a final LayerNorm after the encoder and after the decoder, no embedding LayerNorm, static
  sinusoidal positions from 0 in Marian's layout, ``scale_embedding``, ``final_logits_bias``.
  (MBart adds a LayerNorm after the embeddings and learned positions offset by 2; M2M100's
  sinusoids use other frequencies, ``log(10000) / (C/2 - 1)``, from position 2; FSMT is
  post-norm: none of them is exact.)

Both take their sinusoids in Marian's layout (sin in channels [0, C/2), cos in [C/2, C)).
litmt's default ``sinusoidal`` interleaves them with the same frequencies, so the export
permutes the model's channels (the residual stream): channel ``perm[c]`` of litmt is channel
``c`` of the export, for every embedding column, LayerNorm, and every projection's input or
output on the residual stream. LayerNorm and attention do not depend on the channel order, so
the function is the same. ``sinusoidal_split`` needs no permutation.

The export also keeps litmt's own tokenizer and model config in ``litmt/`` (transformers
ignores it), so that importing the directory again gives back the litmt model exactly.

The tokenizer: a model imported from Marian (a piece vocabulary, eos after every source) goes
back as a ``MarianTokenizer`` (``source.spm``, ``target.spm``, ``vocab.json``). A litmt
sentencepiece tokenizer (joint vocabulary, no eos on the source) becomes a tokenizers
``tokenizer.json`` built from the sentencepiece model by transformers' own converter
(``SpmConverter.build_tokenizer_from_spm_proto``), without a post-processor: no token is added
to the source, as in litmt. (MarianTokenizer always appends eos to the source.)

A multilingual model (``data.directions``) keeps its directions the way multilingual models
in transformers do: each target-language token ``<2xx>`` is an added special token of the
tokenizer (one id, the same as litmt's; dropped by ``skip_special_tokens``), and a direction is
chosen per call (`direction_calls`, written in the model card):

- ``tag_placement=target``: ``generate(..., forced_bos_token_id=<id of <2xx>>)``, the
  NLLB/M2M100 convention; the decoder starts with bos, then the forced tag, as litmt's
  one-token target prefix;
- ``tag_placement=source``: the text starts with ``"<2xx> "``; the added token strips the
  space after it (``rstrip``), so the ids are litmt's ``[tag, *ids of the text]``.

``litmt/model.json`` keeps ``directions`` and ``tag_placement`` for the re-import.

Refused with one line: learned or rotary positions, swiglu, approximate attention, a separate
target vocabulary, a LayerNorm epsilon other than transformers' 1e-5, a multilingual model
whose tokenizer is a Marian piece vocabulary or lacks a direction's ``<2xx>`` piece.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from litmt.checkpoint.hf_names import (
    LITMT_DIR,
    channel_order,
    permute_channels,
    to_hf_layer_weights,
)
from litmt.checkpoint.io import languages_of
from litmt.checkpoint.load import LoadedModel, load_model
from litmt.data.directions import parse_directions
from litmt.data.tokenization.segmentation import model_proto
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from litmt.deploy.export.base import (
    ExportError,
    check_replaceable,
    export_decoding,
    staged_directory,
)
from litmt.deploy.export.ct2_spec import check_exportable
from litmt.deploy.export.hf_card import write_model_card
from litmt.models import TransformerConfig

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu"}  # litmt -> transformers
HF_LAYER_NORM_EPS = 1e-5  # transformers' Marian and Pegasus use nn.LayerNorm's default


def direction_calls(languages: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """How plain transformers translates each direction of a multilingual export: direction
    name (``en-de``) -> (its ``<2xx>`` token, "source" or "target" placement); {} for one pair.
    Target: ``generate(**tok(texts), forced_bos_token_id=tok.convert_tokens_to_ids(tag))``;
    source: ``generate(**tok([f"{tag} {text}" ...]))`` (see the module docstring)."""
    placement = str(languages.get("tag_placement") or "source")
    return {d.name: (d.tag, placement) for d in parse_directions(languages.get("directions"))}


def check_hf_languages(tokenizer: Tokenizer, languages: Mapping[str, Any]) -> None:
    """Raise `ExportError` (one line) if the export cannot carry a multilingual model's
    directions: a Marian piece vocabulary (MarianTokenizer has no per-call language token),
    or a direction whose ``<2xx>`` is not one piece of the tokenizer."""
    calls = direction_calls(languages)
    if calls and tokenizer.vocab is not None:
        raise ExportError(
            "cannot export format=hf: a multilingual model with a Marian piece vocabulary "
            "(MarianTokenizer cannot carry the <2xx> language tokens); use format=ct2"
        )
    for name, (tag, _) in calls.items():
        if tag not in tokenizer.tgt_tags:
            raise ExportError(
                f"cannot export format=hf: direction {name} has no {tag} piece in the tokenizer"
            )


def check_hf_exportable(
    config: TransformerConfig, tokenizer: Tokenizer, languages: Mapping[str, Any] | None = None
) -> None:
    """Raise `ExportError` (one line naming the setting) if no stock class computes the model
    or the export cannot carry its `languages` (`check_hf_languages`)."""
    check_exportable(config)  # approximate attention kernels
    if config.positional not in ("sinusoidal", "sinusoidal_split"):
        raise ExportError(
            f"cannot export format=hf: model.positional={config.positional} has no stock "
            "transformers class (Marian and Pegasus use static sinusoids); use format=ct2"
        )
    if config.activation not in ACTIVATIONS:
        raise ExportError(
            f"cannot export format=hf: model.activation={config.activation} has no stock "
            "transformers seq2seq class; use format=ct2"
        )
    if abs(config.layer_norm_eps - HF_LAYER_NORM_EPS) > 1e-12:
        raise ExportError(
            f"cannot export format=hf: model.layer_norm_eps={config.layer_norm_eps} "
            f"(transformers' Marian and Pegasus use {HF_LAYER_NORM_EPS})"
        )
    if not tokenizer.joint:
        raise ExportError("cannot export format=hf: separate source/target vocabularies")
    if config.norm_first and not config.share_embeddings:
        raise ExportError(
            "cannot export format=hf: model.share_embeddings=false with model.norm_first=true "
            "(Pegasus, the pre-norm class, has one embedding table for encoder and decoder)"
        )
    if tokenizer.src_eos != (tokenizer.vocab is not None):
        raise ExportError(
            "cannot export format=hf: src_eos must go with a piece vocabulary (MarianTokenizer)"
        )
    check_hf_languages(tokenizer, languages or {})


def hf_state_dict(loaded: LoadedModel) -> dict[str, Tensor]:
    """The transformers state dict (``model.`` prefixes) of a litmt model, channels permuted."""
    model, cfg = loaded.model, loaded.model.config
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    out = {f"model.{k}": v for k, v in to_hf_layer_weights(sd, cfg).items()}
    out["model.shared.weight"] = sd["src_embed.weight"]
    out["model.encoder.embed_tokens.weight"] = sd["src_embed.weight"]
    out["model.decoder.embed_tokens.weight"] = sd["tgt_embed.weight"]
    out["lm_head.weight"] = sd["output_proj.weight"]
    bias = sd.get("output_bias", torch.zeros(cfg.tgt_vocab_size))
    perm = channel_order(cfg)
    out = {k: permute_channels(k, v, perm).contiguous() for k, v in out.items()}
    out["final_logits_bias"] = bias[None, :]  # (1, V)
    return out


def hf_config(loaded: LoadedModel) -> Any:
    """The transformers config: Marian for post-norm, Pegasus for pre-norm."""
    from transformers import MarianConfig, PegasusConfig

    cfg = loaded.model.config
    common = dict(
        vocab_size=cfg.src_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=ACTIVATIONS[cfg.activation],
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        scale_embedding=cfg.scale_embeddings,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_output,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,
    )
    if cfg.norm_first:
        config = PegasusConfig(**common)
        config.architectures = ["PegasusForConditionalGeneration"]
    else:
        config = MarianConfig(**common, share_encoder_decoder_embeddings=cfg.share_embeddings)
        config.architectures = ["MarianMTModel"]
    return config


def generation_config(cfg: TransformerConfig, decoding: Mapping[str, Any]) -> Any:
    """litmt's beam size and length penalty, the longest output litmt allows (max_positions);
    what a generation config cannot say is in docs/guide/ship.md#export-for-transformers."""
    from transformers import GenerationConfig

    return GenerationConfig(
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        num_beams=int(decoding["beam_size"]),
        length_penalty=float(decoding["length_penalty"]),
        early_stopping=True,  # a sentence is done with K finished hypotheses, as litmt
        max_length=cfg.max_positions,
    )


def save_hf_tokenizer(
    tokenizer: Tokenizer, out: Path, src_lang: str, tgt_lang: str, tags: Sequence[str] = ()
) -> None:
    """Write the transformers tokenizer files (see the module docstring); `tags`, the
    language tokens of a multilingual model, become added special tokens."""
    if tokenizer.vocab is not None:
        from transformers import MarianTokenizer

        (out / "source.spm").write_bytes(tokenizer.src_model_bytes)
        (out / "target.spm").write_bytes(tokenizer.tgt_model_bytes or tokenizer.src_model_bytes)
        vocab = {p: i for i, p in enumerate(tokenizer.vocab.pieces)}
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        tok = MarianTokenizer(
            str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
            source_lang=src_lang, target_lang=tgt_lang, bos_token="<s>",
        )  # fmt: skip
        tok.save_pretrained(out)
        return
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SpmConverter

    proto = model_proto(tokenizer.src_model_bytes)
    if proto.trainer_spec.model_type != 1:  # 1 = unigram
        raise ExportError("cannot export format=hf: the sentencepiece model is not unigram")
    vocab = [(p.piece, p.score) for p in proto.pieces]
    backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    specials = {i: vocab[i][0] for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=specials[PAD_ID],
        unk_token=specials[UNK_ID],
        bos_token=specials[BOS_ID],
        eos_token=specials[EOS_ID],
        model_max_length=10**6,
        clean_up_tokenization_spaces=False,
    )
    if tags:
        from tokenizers import AddedToken

        # special: skipped in decoding; rstrip: "<2fr> A dog" gives [tag, *ids of "A dog"]
        added = [AddedToken(t, special=True, rstrip=True, normalized=False) for t in tags]
        tok.add_tokens(added, special_tokens=True)
        if tok.convert_tokens_to_ids(list(tags)) != [tokenizer.tgt_tags[t] for t in tags]:
            raise ExportError("cannot export format=hf: a language token changed its id")
    tok.save_pretrained(out)
    # transformers 5 writes its class "TokenizersBackend", which transformers 4 lacks; both
    # load the class name "PreTrainedTokenizerFast" (an alias of it in 5)
    config_file = out / "tokenizer_config.json"
    tok_cfg = json.loads(config_file.read_text(encoding="utf-8"))
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(tok_cfg, indent=2) + "\n", encoding="utf-8")


def export_hf(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
    card: Mapping[str, Any] | None = None,
) -> Path:
    """Write the transformers directory `out` (written next to it, then renamed).

    Args:
        ckpt_path: a litmt checkpoint (several: weights averaged).
        out: the directory (must not exist unless `force`).
        force: replace an existing `out`.
        decoding: litmt decoding defaults for the generation config (beam_size, ...).
        card: model card options (`litmt.deploy.export.hf_card.write_model_card`).

    Raises:
        ExportError: no stock class computes the model. ConfigError: `out` exists.
    """
    out = Path(out)
    check_replaceable(out, force, lambda p: (p / LITMT_DIR / "model.json").is_file())
    decoding_defaults = export_decoding(decoding)
    try:
        from transformers import MarianMTModel, PegasusForConditionalGeneration
    except ImportError as exc:
        raise ExportError("format=hf needs transformers: pip install 'litmt[hf]'") from exc
    loaded = load_model(ckpt_path, map_location="cpu")
    cfg = loaded.model.config
    languages = languages_of(loaded.meta)
    check_hf_exportable(cfg, loaded.tokenizer, languages)
    tags = list(dict.fromkeys(tag for tag, _ in direction_calls(languages).values()))
    config = hf_config(loaded)
    model = (PegasusForConditionalGeneration if cfg.norm_first else MarianMTModel)(config)
    wanted = model.state_dict()  # without model.shared.weight when encoder/decoder differ
    weights = {k: v for k, v in hf_state_dict(loaded).items() if k in wanted}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if "embed_positions" not in k]
    if missing or unexpected:  # a bug in this mapping
        raise ExportError(f"cannot export format=hf: unmapped weight {(missing or unexpected)[0]}")
    model.generation_config = generation_config(cfg, decoding_defaults)
    with staged_directory(out) as tmp:
        model.save_pretrained(tmp)
        save_hf_tokenizer(loaded.tokenizer, tmp, loaded.src_lang, loaded.tgt_lang, tags)
        loaded.tokenizer.save(tmp / LITMT_DIR)  # exact re-import (checkpoint.hf_import)
        meta = {
            "model_config": cfg.to_dict(),
            "src_lang": loaded.src_lang,
            "tgt_lang": loaded.tgt_lang,
            "languages": languages,  # directions, tag_placement ({} for one pair)
        }
        (tmp / LITMT_DIR / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
        paths = [ckpt_path] if isinstance(ckpt_path, str | Path) else list(ckpt_path)
        write_model_card(
            tmp, loaded, paths, type(model).__name__, decoding_defaults, card or {},
            direction_calls(languages),
        )  # fmt: skip
    return out
