"""Export a litmt checkpoint to a CTranslate2 model directory (CPU/GPU inference engine).

The model is described through CTranslate2's Python spec API
(``ctranslate2.specs.TransformerSpec`` with a ``TransformerEncoderSpec`` and a
``TransformerDecoderSpec``), the way its own converters do it
(``ctranslate2/converters/fairseq.py``: ``set_transformer_encoder`` ...), then validated,
quantised (``ModelSpec.optimize``) and saved (``ModelSpec.save``).

What is mapped, and how:

- pre-/post-norm (``pre_norm``; the final encoder/decoder LayerNorm only in pre-norm, as
  litmt); LayerNorm epsilon (``config.layer_norm_epsilon``).
- Positions: CTranslate2's built-in sinusoid (``generate_sinusoidal_position_encoding`` in
  ``src/layers/common.cc``) is *not* litmt's: it concatenates [sin | cos] with timescales
  ``log(10000) / (C/2 - 1)`` and counts positions from 1, while litmt interleaves sin/cos
  with ``log(10000) / (C/2)`` from position 0. So the table is always exported explicitly
  (``position_encodings.encodings``), sinusoidal or learned. RoPE maps to CTranslate2's
  rotary self-attention with ``rotary_interleave=False`` (litmt rotates halves).
- Embeddings: shared or separate source/target tables, tied output projection (the
  spec's variable aliasing stores one copy), ``scale_embeddings`` (sqrt(C) or none).
- Activations: relu, gelu (exact erf form, ``Activation.GELU``), swiglu (``ffn_glu`` with
  ``Activation.SWISH``: ``silu(linear_0(x)) * linear_0_noact(x)``; litmt's fc1 rows hold
  the gate half first).
- Fused projections: litmt's self-attention ``qkv_proj`` rows are [q; k; v] and the
  cross-attention ``kv_proj`` rows [k; v], the fused layouts CTranslate2 expects
  (``utils.fuse_linear`` in the fairseq converter builds the same). Biases are optional.
- Special tokens: litmt's ids pad=0, unk=1, bos=2, eos=3 become CTranslate2's pieces
  ``<blank>``, ``<unk>``, ``<s>``, ``</s>`` at the same ids (the fairseq converter's
  ``<pad>`` -> ``<blank>``); the decoder starts from ``<s>``, no bos/eos on the source.

Refused (`ExportError`, one line): an approximate attention kernel at any site (local,
sparse, linear, flex with a window: ``support.exact`` is false), since CTranslate2 computes
full softmax attention.

An export directory holds ``model.bin``, ``config.json``, the vocabulary file(s), the
sentencepiece model(s) (``src.model``, ``tgt.model`` when separate) and ``litmt.json``
(languages, the source checkpoint's sha256, quantization, decoding defaults).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from litmt.attention import backend_support, build_backend
from litmt.checkpoint.load import load_model
from litmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.errors import BackendError, ConfigError, LitmtError
from litmt.models import Seq2SeqTransformer, TransformerConfig

log = logging.getLogger("litmt.deploy.ct2_export")

METADATA_FILE = "litmt.json"
EXPORT_FORMAT = 1
# quantization= values: "none" keeps float32 weights; the others are CTranslate2 model types.
QUANTIZATIONS = ("none", "int8", "int8_float32", "int8_float16", "float16", "bfloat16")
# litmt special ids -> the pieces CTranslate2's vocabulary conventions use for them.
CT2_SPECIAL_PIECES = {PAD_ID: "<blank>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
# The decoding defaults litmt.json records: these DecodeConfig fields, DecodeConfig's defaults.
DECODING_KEYS = ("beam_size", "length_penalty", "max_len_a", "max_len_b")
DEFAULT_DECODING = {key: getattr(DecodeConfig(), key) for key in DECODING_KEYS}


def _decoding_defaults(decoding: Mapping[str, Any] | None) -> dict[str, Any]:
    """`DEFAULT_DECODING` with the keys `decoding` sets (None = keep), type-checked."""
    config = DecodeConfig.from_options(decoding)  # ConfigError for a mistyped value
    return {key: getattr(config, key) for key in DECODING_KEYS}


class ExportError(LitmtError, ValueError):
    """A model or option that cannot be exported to CTranslate2."""


def import_ctranslate2() -> Any:
    """The ctranslate2 module, or `ExportError` saying how to install it."""
    try:
        import ctranslate2
    except ImportError as exc:
        raise ExportError(
            "the CTranslate2 engine needs the ctranslate2 package: pip install 'litmt[ct2]'"
        ) from exc
    return ctranslate2


def _is_exact(name: str, options: dict[str, Any]) -> bool:
    """Whether kernel `name` with `options` computes full softmax attention (its `support`)."""
    try:
        return bool(build_backend(name, **options).support.exact)  # options may change it (flex)
    except BackendError:  # cannot be built here (e.g. its package is missing): the declaration
        return bool(backend_support(name).exact)


def check_exportable(config: TransformerConfig) -> None:
    """Raise `ExportError` if CTranslate2 cannot represent this model.

    CTranslate2 computes full softmax attention, so a site whose kernel is approximate
    (``support.exact`` false: local, sparse, linear, flex with a window or layout) is refused.

    Raises:
        ExportError: one line naming the setting and why.
    """
    for site in ("encoder_self", "decoder_self", "cross"):
        name, options = config.attention.backend(site)
        if not _is_exact(name, options):
            raise ExportError(
                f"cannot export: model.attention.{site}={name} is an approximate attention "
                "(CTranslate2 only computes full softmax attention, so its outputs would differ)"
            )


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


def _linear(spec: Any, module: nn.Linear, rows: slice | None = None) -> None:
    weight = module.weight if rows is None else module.weight[rows]
    spec.weight = _np(weight)
    if module.bias is not None:
        spec.bias = _np(module.bias if rows is None else module.bias[rows])


def _norm(spec: Any, module: nn.LayerNorm) -> None:
    spec.gamma = _np(module.weight)
    spec.beta = _np(module.bias) if module.bias is not None else np.zeros_like(spec.gamma)


def _ffn(spec: Any, ffn: nn.Module, norm: nn.LayerNorm, config: TransformerConfig) -> None:
    _norm(spec.layer_norm, norm)
    if config.activation == "swiglu":  # fc1 rows: [gate (activated); value]
        _linear(spec.linear_0, ffn.fc1, slice(0, config.d_ff))
        _linear(spec.linear_0_noact, ffn.fc1, slice(config.d_ff, 2 * config.d_ff))
    else:
        _linear(spec.linear_0, ffn.fc1)
    _linear(spec.linear_1, ffn.fc2)


def _self_attention(spec: Any, mha: nn.Module, norm: nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear[0], mha.qkv_proj)  # rows [q; k; v], CTranslate2's fused layout
    _linear(spec.linear[1], mha.out_proj)


def _cross_attention(spec: Any, mha: nn.Module, norm: nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear[0], mha.q_proj)
    _linear(spec.linear[1], mha.kv_proj)  # rows [k; v]
    _linear(spec.linear[2], mha.out_proj)


def _positions(model: Seq2SeqTransformer, side: str) -> np.ndarray | None:
    """The (max_positions, C) table added to the embeddings of `side`, or None (RoPE)."""
    cfg = model.config
    if cfg.positional == "sinusoidal":
        return _np(model.pos_encoding(cfg.max_positions))
    if cfg.positional == "learned":
        return _np(getattr(model, f"{side}_pos")(cfg.max_positions))
    return None


def ct2_vocabulary(tokenizer: Tokenizer, side: str) -> list[str]:
    """The `side` ("src" | "tgt") pieces by id, with CTranslate2's special-token spellings."""
    proc = tokenizer.src if side == "src" else tokenizer.tgt
    specials = (proc.pad_id(), proc.unk_id(), proc.bos_id(), proc.eos_id())
    if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise ExportError(
            f"cannot export: the {side} tokenizer's pad/unk/bos/eos ids are {specials}, "
            f"litmt's are {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
        )
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    for i, piece in CT2_SPECIAL_PIECES.items():
        pieces[i] = piece
    if len(set(pieces)) != len(pieces):
        raise ExportError(
            f"cannot export: the {side} vocabulary has a piece spelled like a CTranslate2 "
            f"special token ({', '.join(CT2_SPECIAL_PIECES.values())})"
        )
    return pieces


def build_spec(model: Seq2SeqTransformer, tokenizer: Tokenizer) -> Any:
    """A validated ``ctranslate2.specs.TransformerSpec`` holding `model`'s weights.

    Raises:
        ExportError: the model cannot be represented (see `check_exportable`).
    """
    ct2 = import_ctranslate2()
    specs = ct2.specs
    cfg = model.config
    check_exportable(cfg)
    activation = {
        "relu": specs.Activation.RELU,
        "gelu": specs.Activation.GELU,  # exact erf GELU, as torch's F.gelu default
        "swiglu": specs.Activation.SWISH,  # silu
    }[cfg.activation]
    rope = cfg.positional == "rope"
    common: dict[str, Any] = dict(
        pre_norm=cfg.norm_first, activation=activation, ffn_glu=cfg.activation == "swiglu"
    )
    if rope:  # all head dims, rotate-half (not interleaved) like litmt's RotaryEmbedding
        common.update(rotary_dim=0, rotary_interleave=False, rotary_base=10000.0)
    encoder = specs.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, **common)
    decoder = specs.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **common)
    spec = specs.TransformerSpec(encoder, decoder)

    for side, part, table in (("src", encoder, model.src_embed), ("tgt", decoder, model.tgt_embed)):
        embeddings = part.embeddings[0] if isinstance(part.embeddings, list) else part.embeddings
        embeddings.weight = _np(table.weight)
        part.scale_embeddings = bool(cfg.scale_embeddings)  # True: sqrt(C), False: none
        positions = _positions(model, side)
        if positions is not None:
            part.position_encodings.encodings = positions
        elif hasattr(part, "position_encodings"):  # the encoder spec always declares one
            del part.position_encodings
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _ffn(layer_spec.ffn, layer.ffn, layer.norm2, cfg)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        _self_attention(layer_spec.self_attention, layer.self_attn, layer.norm1)
        _cross_attention(layer_spec.attention, layer.cross_attn, layer.norm2)
        _ffn(layer_spec.ffn, layer.ffn, layer.norm3, cfg)
    if cfg.norm_first:
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)
    _linear(decoder.projection, model.output_proj)  # tied: aliased to the embedding on save

    spec.register_source_vocabulary(ct2_vocabulary(tokenizer, "src"))
    spec.register_target_vocabulary(ct2_vocabulary(tokenizer, "tgt"))
    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token, spec.config.bos_token = "<unk>", "<s>"
    spec.config.eos_token, spec.config.decoder_start_token = "</s>", "<s>"
    spec.config.add_source_bos = spec.config.add_source_eos = False
    try:
        spec.validate()
    except ValueError as exc:  # a weight the spec expects was not set: a bug in this mapping
        raise ExportError(f"cannot export: {str(exc).splitlines()[0]}") from exc
    return spec


def file_sha256(paths: str | Path | Sequence[str | Path]) -> str:
    """sha256 of a file (several files: of their digests, in order)."""
    path_list = [paths] if isinstance(paths, str | Path) else list(paths)
    digests = []
    for p in path_list:
        h = hashlib.sha256()
        with Path(p).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digests.append(h.hexdigest())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(digests).encode()).hexdigest()


def _check_quantization(quantization: str | None) -> str:
    q = "none" if quantization in (None, "null", "float32") else str(quantization)
    if q not in QUANTIZATIONS:
        raise ConfigError(
            f"unknown quantization '{quantization}'; valid values: {', '.join(QUANTIZATIONS)}"
        )
    return q


def export_model(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    quantization: str = "none",
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
) -> Path:
    """Convert a checkpoint (several: weights averaged) into a CTranslate2 directory `out`.

    Args:
        ckpt_path: a litmt ``.ckpt`` or a list of them.
        out: the directory to write (must not exist unless `force`).
        quantization: one of `QUANTIZATIONS` (weights stored as int8, float16, ...).
        force: replace an existing `out`.
        decoding: decoding defaults written to the metadata (beam_size, length_penalty,
            max_len_a, max_len_b); missing or None keys take `DEFAULT_DECODING`.

    Returns:
        `out`.

    Raises:
        ExportError: the model cannot be represented. CheckpointError: unreadable checkpoint.
    """
    q = _check_quantization(quantization)
    out = Path(out)
    if out.exists() and not force:
        raise ConfigError(f"export directory {out} already exists; pass force=true to replace it")
    if out.exists() and not is_export_dir(out) and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"{out} exists and is not a litmt export; force=true only replaces exports"
        )
    loaded = load_model(ckpt_path, map_location="cpu")
    spec = build_spec(loaded.model, loaded.tokenizer)
    spec.optimize(quantization=None if q == "none" else q)
    paths = [ckpt_path] if isinstance(ckpt_path, str | Path) else list(ckpt_path)
    meta = {
        "format": EXPORT_FORMAT,
        "src_lang": loaded.src_lang,
        "tgt_lang": loaded.tgt_lang,
        "checkpoints": [Path(p).name for p in paths],
        "checkpoint_sha256": file_sha256(paths),
        "quantization": q,
        "max_positions": loaded.model.config.max_positions,
        "joint_vocabulary": loaded.tokenizer.joint,
        "special_tokens": {str(i): p for i, p in CT2_SPECIAL_PIECES.items()},
        "decoding": _decoding_defaults(decoding),
        "model_config": loaded.model.config.to_dict(),
    }
    # Write next to `out`, then rename: a failed export leaves no half-written directory.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        spec.save(str(tmp))
        loaded.tokenizer.save(tmp)
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s (%s) to %s", paths[0], q, out)
    return out


def is_export_dir(path: str | Path) -> bool:
    """True when `path` is a directory written by `export_model`."""
    p = Path(path)
    return p.is_dir() and (p / METADATA_FILE).is_file() and (p / "model.bin").is_file()


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``litmt.json`` of an export directory.

    Raises:
        ExportError: not an export directory, or written by another format version.
    """
    p = Path(path)
    if not is_export_dir(p):
        raise ExportError(
            f"{p} is not a litmt CTranslate2 export (no {METADATA_FILE} and model.bin); "
            "create one with scripts/export.py"
        )
    meta = json.loads((p / METADATA_FILE).read_text(encoding="utf-8"))
    if meta.get("format") != EXPORT_FORMAT:
        raise ExportError(
            f"{p} has export format {meta.get('format')}, this litmt reads {EXPORT_FORMAT}"
        )
    return meta


def cached_export(ckpt_path: str | Path, cache_dir: str | Path, quantization: str = "none") -> Path:
    """The export of `ckpt_path` in `cache_dir`, converted on first use.

    The cache entry is named by the checkpoint's sha256 and the quantization, so a changed
    checkpoint is converted again.
    """
    q = _check_quantization(quantization)
    digest = file_sha256(ckpt_path)
    target = Path(cache_dir) / f"{Path(ckpt_path).stem}-{digest[:16]}-{q}"
    if is_export_dir(target):
        return target
    log.info("converting %s for the ct2 engine into %s (first use)", ckpt_path, target)
    return export_model(ckpt_path, target, quantization=q, force=True)


__all__ = [
    "QUANTIZATIONS",
    "ExportError",
    "build_spec",
    "cached_export",
    "check_exportable",
    "ct2_vocabulary",
    "export_model",
    "is_export_dir",
    "read_metadata",
]
