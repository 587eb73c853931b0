"""A transformers Marian directory (``save_pretrained`` of a ``MarianMTModel`` and its
``MarianTokenizer``) as a litmt model: config, weights and tokenizer.

Reads only files: ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``, loaded
weights-only), ``source.spm``, ``target.spm``, ``vocab.json`` and ``tokenizer_config.json``;
transformers itself is not needed. A hub model is downloaded first
(``huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir DIR``); nothing here
touches the network.

The mapping (transformers' ``models/marian/modeling_marian.py``):

- post-norm layers (``norm_first=false``), no final encoder/decoder LayerNorm, eps 1e-5;
- static sinusoidal positions from 0, sin in the first half of the channels and cos in the
  second (``positional=sinusoidal_split``); ``scale_embedding``; the activation (``swish`` /
  ``silu``, ``gelu``, ``relu``);
- q/k/v projections fused into litmt's ``qkv_proj`` ([q; k; v]) and ``kv_proj`` ([k; v]);
- the vocabulary: Marian's ids (``</s>`` 0, ``<unk>`` 1, ..., ``<pad>`` last, also the
  decoder start) are renumbered to litmt's (`HF_SPECIALS` first): litmt's pad 0 is a new,
  zero row that is never predicted (its logit bias is `NEVER_LOGIT`), unk 1, bos 2 = Marian's
  decoder start token (its pad), eos 3, then every other Marian id in order. So the model has
  one id more than Marian's, and litmt's id ``j`` is Marian's ``marian_ids[j]``;
- ``final_logits_bias`` -> ``output_bias``; tied (``tie_word_embeddings``) or separate output
  projection; the source and target sentencepiece models split text, ``vocab.json`` gives
  the ids (`litmt.data.tokenization.piece_vocab`), and every source ends with eos, as MarianTokenizer.

A directory written by litmt's ``format=hf`` export (Marian or Pegasus, with ``litmt/``
holding litmt's tokenizer and model config) is read back exactly: the stored config, the
tokenizer byte for byte, the weights from the transformers files with the export's channel
permutation undone (`litmt.checkpoint.hf_names.permute_channels`), and a multilingual model's
``directions`` and ``tag_placement`` (`ImportedModel.languages`), so export -> import is the
identity.

Refused with one line naming the field: another model type, separate source/target
vocabularies, different encoder/decoder widths or heads, an activation litmt lacks, a
decoder start token other than pad.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from litmt.checkpoint.hf_names import LITMT_DIR, channel_order, hf_layer_weights, permute_channels
from litmt.data.tokenization.piece_vocab import SPECIAL_PIECES
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import CheckpointError
from litmt.models import Seq2SeqTransformer, TransformerConfig
from litmt.models.transformer import NEVER_LOGIT

# transformers' activation names (ACT2FN) -> litmt's
ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}


@dataclass
class ImportedModel:
    """A Marian directory as litmt parts.

    Attributes:
        config: the litmt model config.
        weights: the litmt state dict (every key of `Seq2SeqTransformer(config).state_dict()`).
        tokenizer: sentencepiece models + piece vocabulary (litmt ids), source eos.
        src_lang, tgt_lang: the direction (tokenizer_config.json, else the arguments).
        marian_ids: litmt id -> Marian id (-1 for litmt's pad row).
        languages: a multilingual model's ``directions`` and ``tag_placement`` (the
            checkpoint's `litmt.checkpoint.io.LANGUAGE_KEYS`; {} for one pair).
    """

    config: TransformerConfig
    weights: dict[str, Tensor]
    tokenizer: Tokenizer
    src_lang: str
    tgt_lang: str
    marian_ids: list[int]
    languages: dict[str, Any] = field(default_factory=dict)


def is_hf_dir(path: str | Path) -> bool:
    """True when `path` is a directory holding a transformers ``config.json``."""
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def _need(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {name}; pass a MarianMTModel save_pretrained directory "
            "(config.json, model.safetensors, source.spm, target.spm, vocab.json)"
        )
    return path


def _refuse(field: str, value: Any, why: str) -> CheckpointError:
    return CheckpointError(f"cannot import: config.json {field}={value!r}: {why}")


def marian_config(hf: dict[str, Any], *, share: bool = True, tie: bool = True) -> TransformerConfig:
    """The litmt config of a Marian ``config.json`` (one-line `CheckpointError` if unmappable).

    `share`: one embedding table for encoder and decoder; `tie`: the output projection is the
    decoder's embedding table (both are read from the weights: transformers 5 unties all
    three tables when ``tie_word_embeddings`` is false, earlier versions only the output).
    """
    if hf.get("model_type") != "marian":
        raise _refuse("model_type", hf.get("model_type"), "only MarianMTModel is imported")
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(a) != hf.get(b):
            raise _refuse(b, hf.get(b), f"litmt needs it equal to {a}={hf.get(a)}")
    if not hf.get("share_encoder_decoder_embeddings", True):
        raise _refuse("share_encoder_decoder_embeddings", False, "separate vocabularies")
    dec_vocab = hf.get("decoder_vocab_size") or hf["vocab_size"]
    if dec_vocab != hf["vocab_size"]:
        raise _refuse("decoder_vocab_size", dec_vocab, "separate vocabularies")
    act = hf.get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        raise _refuse("activation_function", act, f"litmt has {', '.join(ACTIVATIONS)}")
    start = hf.get("decoder_start_token_id", hf.get("pad_token_id"))
    if start != hf.get("pad_token_id"):
        raise _refuse("decoder_start_token_id", start, "litmt imports pad as the decoder start")
    return TransformerConfig(
        src_vocab_size=int(hf["vocab_size"]) + 1,  # + litmt's pad row
        d_model=int(hf["d_model"]),
        n_heads=int(hf["encoder_attention_heads"]),
        d_ff=int(hf["encoder_ffn_dim"]),
        n_encoder_layers=int(hf["encoder_layers"]),
        n_decoder_layers=int(hf["decoder_layers"]),
        dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)),
        activation=ACTIVATIONS[act],
        norm_first=False,
        positional="sinusoidal_split",
        max_positions=int(hf.get("max_position_embeddings", 512)),
        share_embeddings=share,
        tie_output=tie,
        scale_embeddings=bool(hf.get("scale_embedding", False)),
        output_bias=True,
    )


def _marian_ids(hf: dict[str, Any], vocab: dict[str, int]) -> list[int]:
    """litmt id -> Marian id: [-1 (litmt pad), unk, decoder start, eos, every other id]."""
    unk = vocab.get("<unk>")
    if unk is None:
        raise CheckpointError("cannot import: vocab.json has no <unk>")
    specials = [int(hf["pad_token_id"]), int(unk), int(hf["eos_token_id"])]
    first = [-1, specials[1], specials[0], specials[2]]
    rest = [i for i in range(int(hf["vocab_size"])) if i not in specials]
    return first + rest


def _weights(directory: Path) -> dict[str, Tensor]:
    st = directory / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file  # the `hf` extra

        return load_file(str(st))
    bin_file = _need(directory, "pytorch_model.bin")
    return torch.load(bin_file, map_location="cpu", weights_only=True)


def _rows(table: Tensor, ids: list[int], fill: float = 0.0) -> Tensor:
    """Rows of `table` (N, ...) in litmt's id order; the row of id -1 is `fill`."""
    index = torch.tensor([max(i, 0) for i in ids])
    out = table.index_select(0, index).clone()
    out[torch.tensor(ids) < 0] = fill
    return out


def read_marian_dir(
    directory: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> ImportedModel:
    """Read a Marian ``save_pretrained`` directory as litmt parts (see the module docstring).

    Args:
        directory: the directory.
        src_lang, tgt_lang: the direction when tokenizer_config.json does not name it.

    Raises:
        CheckpointError: a missing file or a field litmt cannot map (one line naming it).
    """
    d = Path(directory)
    hf = _read_json(_need(d, "config.json"))
    marian_config(hf)  # refuse an unmappable config before reading the weights
    tok_cfg = (
        _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
    )
    if tok_cfg.get("separate_vocabs") or (d / "target_vocab.json").is_file():
        raise CheckpointError(
            "cannot import: tokenizer separate_vocabs=true (separate vocabularies)"
        )
    vocab = _read_json(_need(d, "vocab.json"))
    if len(vocab) != int(hf["vocab_size"]) or sorted(vocab.values()) != list(range(len(vocab))):
        raise CheckpointError(
            f"cannot import: vocab.json has {len(vocab)} pieces with ids other than "
            f"0..{int(hf['vocab_size']) - 1} (config.json vocab_size)"
        )
    ids = _marian_ids(hf, vocab)
    piece_of = {i: p for p, i in vocab.items()}
    tokenizer = Tokenizer(
        _need(d, "source.spm").read_bytes(),
        _need(d, "target.spm").read_bytes(),
        vocab=[*SPECIAL_PIECES, *(piece_of[i] for i in ids[4:])],
        src_eos=True,
    )
    hf_weights = {k.removeprefix("model."): v.float() for k, v in _weights(d).items()}
    shared = hf_weights.get("shared.weight")
    enc = hf_weights.get("encoder.embed_tokens.weight", shared)
    dec = hf_weights.get("decoder.embed_tokens.weight", shared)
    if enc is None or dec is None:
        raise CheckpointError(f"cannot import: {d} has no shared.weight (token embeddings)")
    lm_head = hf_weights.get("lm_head.weight", dec)
    config = marian_config(hf, share=torch.equal(enc, dec), tie=torch.equal(dec, lm_head))
    bias = hf_weights.get("final_logits_bias", torch.zeros(1, dec.size(0)))[0]
    weights = {
        "src_embed.weight": _rows(enc, ids),
        "tgt_embed.weight": _rows(dec, ids),
        "output_proj.weight": _rows(lm_head, ids),
        "output_bias": _rows(bias, ids, fill=NEVER_LOGIT),
    }
    try:
        weights.update(hf_layer_weights(hf_weights, config))
    except KeyError as exc:
        raise CheckpointError(f"cannot import: {d} has no weight {exc.args[0]}") from None
    expected = set(Seq2SeqTransformer(config).state_dict())
    unmapped = sorted(expected ^ set(weights))
    if unmapped:  # a bug in this mapping, not in the directory
        raise CheckpointError(f"cannot import: no mapping for litmt weight {unmapped[0]}")
    return ImportedModel(
        config,
        weights,
        tokenizer,
        src_lang or tok_cfg.get("source_lang") or "src",
        tgt_lang or tok_cfg.get("target_lang") or "tgt",
        ids,
    )


def _read_litmt_export(d: Path, hf: dict[str, Any], hf_weights: dict[str, Tensor]) -> ImportedModel:
    """A ``format=hf`` export of litmt (see the module docstring)."""
    meta = _read_json(d / LITMT_DIR / "model.json")
    config = TransformerConfig.from_dict(meta["model_config"])
    kind = "pegasus" if config.norm_first else "marian"
    if hf.get("model_type") != kind or int(hf["d_model"]) != config.d_model:
        raise _refuse("model_type", hf.get("model_type"), f"litmt/model.json describes a {kind}")
    inverse = torch.argsort(channel_order(config))
    theirs = {k: permute_channels(k, v, inverse) for k, v in hf_weights.items()}
    vocab = config.tgt_vocab_size
    weights = {
        "src_embed.weight": theirs["encoder.embed_tokens.weight"],
        "tgt_embed.weight": theirs["decoder.embed_tokens.weight"],
        "output_proj.weight": theirs["lm_head.weight"],
    }
    if config.output_bias:
        weights["output_bias"] = hf_weights["final_logits_bias"].reshape(vocab)
    weights.update(hf_layer_weights(theirs, config))
    tokenizer = Tokenizer.load(d / LITMT_DIR)
    ids = list(range(vocab))
    languages = dict(meta.get("languages") or {})
    return ImportedModel(
        config, weights, tokenizer, meta["src_lang"], meta["tgt_lang"], ids, languages
    )


def read_hf_dir(
    directory: str | Path, src_lang: str | None = None, tgt_lang: str | None = None
) -> ImportedModel:
    """A transformers directory as litmt parts: a litmt ``format=hf`` export (exactly), else
    a Marian model (`read_marian_dir`).

    Raises:
        CheckpointError: a missing file or a field litmt cannot map (one line naming it).
    """
    d = Path(directory)
    if not (d / LITMT_DIR / "model.json").is_file():
        return read_marian_dir(d, src_lang, tgt_lang)
    hf = _read_json(_need(d, "config.json"))
    hf_weights = {k.removeprefix("model."): v.float() for k, v in _weights(d).items()}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        if name not in hf_weights:  # tied: saved once
            tied = "decoder.embed_tokens.weight" if name == "lm_head.weight" else "shared.weight"
            hf_weights[name] = hf_weights.get(tied, hf_weights.get("shared.weight"))
    try:
        imported = _read_litmt_export(d, hf, hf_weights)
    except KeyError as exc:
        raise CheckpointError(f"cannot import: {d} has no weight {exc.args[0]}") from None
    expected = set(Seq2SeqTransformer(imported.config).state_dict())
    unmapped = sorted(expected ^ set(imported.weights))
    if unmapped:
        raise CheckpointError(f"cannot import: no mapping for litmt weight {unmapped[0]}")
    if src_lang or tgt_lang:
        imported.src_lang = src_lang or imported.src_lang
        imported.tgt_lang = tgt_lang or imported.tgt_lang
    return imported
