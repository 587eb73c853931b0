"""Export a litmt checkpoint to ONNX: an encoder graph and a decoder-step graph with a
self-attention key/value cache, for onnxruntime (``engine=onnx``, `litmt.deploy.engines.onnx`)
and onnxruntime-web in a page.

An export directory holds:

- ``encoder.onnx``: ``src_ids`` int64 (batch, src_len) -> ``cross_k_0`` ... ``cross_k_{L-1}``,
  ``cross_v_0`` ... float32 (batch, heads, src_len, head_dim) each: the encoder and every
  decoder layer's cross-attention keys and values, computed once per sentence.
- ``decoder.onnx``: one step. ``tokens`` int64 (batch,), ``src_ids`` int64 (sources,
  src_len), then ``cross_k_i``/``cross_v_i`` (sources, heads, src_len, head_dim) and
  ``self_k_i``/``self_v_i`` float32 (batch, heads, past_len, head_dim: row b's past in row b;
  an empty past_len=0 tensor at the first step), one per decoder layer -> ``logits`` float32
  (batch, tgt_vocab),
  ``new_self_k_i``/``new_self_v_i`` (past_len + 1). The batch is G rows per source, in order
  (rows n * G ... n * G + G - 1 read source n: a beam search's beams share their sentence's
  cross-attention keys and values, stored and read once; G = 1 for a source per row). The
  new token's position is past_len, read inside the graph; the padding mask is
  ``src_ids == pad``. A caller passes the previous step's ``new_self_k_i``/``new_self_v_i``
  back as they came out, or, at a step after its rows moved (a beam search's reorder, rows
  dropped), their rows gathered in the new order. ``config.json`` lists every input and
  output name in order.
- ``shared.bin``: the weights both graphs hold (the embedding of a model with shared
  embeddings: the encoder's source embedding, the decoder's target embedding and tied output
  projection), stored once as ONNX external data that both graphs name (`share_weights`);
  absent when the graphs share nothing.
- ``config.json``: the format and its version, the special ids, languages, tags and their
  placement, the decoding defaults, the model's sizes and the graphs' input/output names.
- the tokenizer as `litmt.data.tokenization.tokenizer.Tokenizer.save` writes it: ``src.model``
  (+ ``tgt.model``, + ``pieces.json`` for an imported Marian vocabulary).

The graphs (`litmt.deploy.export.onnx_graphs`) are traced with torch's TorchScript-based exporter
(``torch.onnx.export(..., dynamo=False)``): positions are counted from the input tensors'
data, so one trace serves every batch size, source length and past length, including the
empty cache of the first step and batch 1, which the torch.export-based exporter would
specialise (it treats sizes 0 and 1 as constants), and it needs no ``onnxscript``.

``quantization=int8`` applies onnxruntime's dynamic quantization
(``onnxruntime.quantization.quantize_dynamic``: int8 weights of the MatMuls and of the output
projection's Gemm, activations quantized at run time) to both graphs, under the same file
names.

Format version 6 (the caller reorders the past, only at the steps whose rows moved; version 5
gathered it at every step inside the graph by a ``beam_index`` input, version 3 took the
cross-attention keys and values once per row instead of once per source, version 2 stacked
the layers' caches, version 1 had no ``beam_index`` and no ``shared.bin``; a version 4 with a
cache the caller owned was measured and not released); exports of another version are
refused with one line saying to export again.

Refused with one line (`ExportError`): an approximate attention kernel at any site (local,
sparse, linear, flex with a window), whose outputs the graphs' full softmax attention would
change; other quantizations.
"""

from __future__ import annotations

import importlib
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from litmt.attention import backend_support, build_backend
from litmt.checkpoint.io import languages_of
from litmt.checkpoint.load import LoadedModel, load_model
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, PIECES_FILE, UNK_ID
from litmt.deploy.export.base import (
    ExportError,
    check_replaceable,
    checked_quantization,
    export_decoding,
    file_sha256,
    staged_directory,
)
from litmt.deploy.export.onnx_graphs import DecoderStepGraph, EncoderGraph, layer_names
from litmt.errors import BackendError

log = logging.getLogger("litmt.deploy.export.onnx")

CONFIG_FILE = "config.json"
FORMAT_NAME = "litmt-onnx"
FORMAT_VERSION = 6
OPSET = 17
SHARED_FILE = "shared.bin"  # the weights both graphs hold, stored once (external data)
SHARE_MIN_BYTES = 4096  # smaller equal initializers stay in each graph
ONNX_QUANTIZATIONS = ("none", "int8")
ENCODER_FILE, DECODER_FILE = "encoder.onnx", "decoder.onnx"
ENCODER_INPUTS = ["src_ids"]
ONNX_MISSING = "format=onnx and engine=onnx need onnx and onnxruntime: pip install 'litmt[onnx]'"


def cache_names(layers: int) -> dict[str, list[str]]:
    """The per-layer cache tensors' names of a model with `layers` decoder layers, in graph
    order: ``cross`` (``cross_k_i``..., ``cross_v_i``...: the encoder's outputs, the decoder's
    inputs), ``past`` (``self_k_i``..., ``self_v_i``...: the decoder's inputs) and ``new``
    (``new_self_k_i``...: its outputs, the next step's ``past`` in the same order)."""
    cross = layer_names("cross_k", layers) + layer_names("cross_v", layers)
    past = layer_names("self_k", layers) + layer_names("self_v", layers)
    return {"cross": cross, "past": past, "new": [f"new_{name}" for name in past]}


def graph_names(layers: int) -> dict[str, dict[str, list[str]]]:
    """The input and output names of both graphs of a model with `layers` decoder layers, in
    order (``config.json``'s ``inputs`` and ``outputs``)."""
    cache = cache_names(layers)
    return {
        "inputs": {
            "encoder": ENCODER_INPUTS,
            "decoder": ["tokens", "src_ids", *cache["cross"], *cache["past"]],
        },
        "outputs": {"encoder": cache["cross"], "decoder": ["logits", *cache["new"]]},
    }


def _dynamic_axes(layers: int) -> tuple[dict[str, dict[int, str]], dict[str, dict[int, str]]]:
    """The named dynamic axes of the encoder's and the decoder's inputs and outputs."""
    cache = cache_names(layers)
    kv = {0: "batch", 2: "src_len"}  # cross_k_i/cross_v_i: (batch, heads, src_len, head_dim)
    encoder = {"src_ids": {0: "batch", 1: "src_len"}} | {name: kv for name in cache["cross"]}
    decoder = {"tokens": {0: "batch"}, "src_ids": {0: "sources", 1: "src_len"}}
    decoder |= {"logits": {0: "batch"}}
    decoder |= {name: {0: "sources", 2: "src_len"} for name in cache["cross"]}
    decoder |= {name: {0: "batch", 2: "past_len"} for name in cache["past"]}
    decoder |= {name: {0: "batch", 2: "new_len"} for name in cache["new"]}
    return encoder, decoder


def _import_required(name: str) -> Any:
    """Module `name` of the ``onnx`` extra, or `ExportError` saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ExportError(ONNX_MISSING) from exc


def import_onnxruntime() -> Any:
    """The onnxruntime module, or `ExportError` saying how to install it."""
    return _import_required("onnxruntime")


def import_onnx() -> Any:
    """The onnx module, or `ExportError` saying how to install it."""
    return _import_required("onnx")


def check_onnx_exportable(config: Any) -> None:
    """Raise `ExportError` (one line) when a site's kernel is not full softmax attention.

    Args:
        config: the model's `TransformerConfig`.
    """
    for site in ("encoder_self", "decoder_self", "cross"):
        name, options = config.attention.backend(site)
        try:
            exact = bool(build_backend(name, **options).support.exact)
        except BackendError:  # its package is missing here: its declaration
            exact = bool(backend_support(name).exact)
        if not exact:
            raise ExportError(
                f"cannot export format=onnx: model.attention.{site}={name} is an approximate "
                "attention (the ONNX graphs compute full softmax attention)"
            )


def export_onnx(
    ckpt_path: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    quantization: str = "none",
    force: bool = False,
    decoding: Mapping[str, Any] | None = None,
) -> Path:
    """Write the ONNX export of a checkpoint (several: weights averaged) into `out`.

    Args:
        ckpt_path: a litmt ``.ckpt`` or a list of them.
        out: the directory to write (must not exist unless `force`).
        quantization: "none" (float32) or "int8" (onnxruntime dynamic quantization).
        force: replace an existing export at `out`.
        decoding: decoding defaults for ``config.json`` (beam_size, length_penalty,
            max_len_a, max_len_b); missing keys take `DecodeConfig`'s.

    Returns:
        `out`.

    Raises:
        ExportError: the model cannot be carried, or onnxruntime is missing. ConfigError:
        `out` exists, a bad option.
    """
    q = checked_quantization(quantization, ONNX_QUANTIZATIONS, "onnx")
    out = Path(out)
    check_replaceable(out, force, is_onnx_dir)
    decoding_defaults = export_decoding(decoding)
    import_onnxruntime()
    paths = [ckpt_path] if isinstance(ckpt_path, str | Path) else list(ckpt_path)
    loaded = load_model(paths if len(paths) > 1 else paths[0], map_location="cpu")
    check_onnx_exportable(loaded.model.config)
    model = loaded.model.float().eval()
    with staged_directory(out) as tmp:
        _trace(model, tmp)
        if q == "int8":
            _quantize(tmp)
        shared = share_weights(tmp)
        loaded.tokenizer.save(tmp)
        meta = onnx_config(loaded, q, decoding_defaults, file_sha256(paths), shared)
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    log.info("exported %s (onnx, %s) to %s", paths[0], q, out)
    return out


def _trace(model: torch.nn.Module, directory: Path) -> None:
    """Trace `EncoderGraph` and `DecoderStepGraph` of `model` into `directory` (float32,
    every length and the batch dynamic)."""
    cfg = model.config
    src = torch.tensor([[4, 5, 6, 7], [8, 9, PAD_ID, PAD_ID]])  # (2, 4): any ids < vocab
    src = src.clamp(max=cfg.src_vocab_size - 1)
    encoder, decoder = EncoderGraph(model), DecoderStepGraph(model)
    layers = cfg.n_decoder_layers
    names = graph_names(layers)
    encoder_axes, decoder_axes = _dynamic_axes(layers)
    past = [torch.zeros(2, cfg.n_heads, 3, cfg.head_dim) for _ in range(2 * layers)]
    with torch.no_grad(), warnings.catch_warnings():
        # the TorchScript exporter is chosen on purpose (module docstring): not its notice
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.onnx")
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        cross = encoder(src)
        common = {"dynamo": False, "opset_version": OPSET, "do_constant_folding": True}
        torch.onnx.export(
            encoder,
            (src,),
            str(directory / ENCODER_FILE),
            input_names=names["inputs"]["encoder"],
            output_names=names["outputs"]["encoder"],
            dynamic_axes=encoder_axes,
            **common,
        )
        torch.onnx.export(
            decoder,
            (torch.full((2,), BOS_ID), src, *cross, *past),
            str(directory / DECODER_FILE),
            input_names=names["inputs"]["decoder"],
            output_names=names["outputs"]["decoder"],
            dynamic_axes=decoder_axes,
            **common,
        )


def _quantize(directory: Path) -> None:
    """Replace both graphs by their int8 dynamic quantization (MatMul weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    for name in (ENCODER_FILE, DECODER_FILE):
        path = directory / name
        pre, tmp = path.with_suffix(".pre.onnx"), path.with_suffix(".int8.onnx")
        # onnx shape inference and fusions, as onnxruntime advises (its symbolic shape
        # inference cannot follow the data-derived positions: skipped)
        quant_pre_process(str(path), str(pre), skip_symbolic_shape=True)
        quantize_dynamic(
            str(pre),
            str(tmp),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Gemm"],
        )
        pre.unlink()
        tmp.replace(path)


def share_weights(directory: Path) -> bool:
    """Store the initializers the two graphs in `directory` both hold (equal name-independent
    contents: dtype, shape and bytes; at least `SHARE_MIN_BYTES`) once, in `SHARED_FILE`, as
    ONNX external data both graphs point to; True when there were any.

    onnxruntime reads external data relative to the graph's file (python), or from the
    ``externalData`` session option (onnxruntime-web: the page passes the file's bytes)."""
    onnx = import_onnx()
    from onnx.external_data_helper import set_external_data

    graphs = {name: onnx.load(str(directory / name)) for name in (ENCODER_FILE, DECODER_FILE)}

    def key(t: Any) -> tuple:
        return (t.data_type, tuple(t.dims), t.raw_data)

    by_graph = [
        {key(t): t for t in g.graph.initializer if len(t.raw_data) >= SHARE_MIN_BYTES}
        for g in graphs.values()
    ]
    common = [k for k in by_graph[0] if k in by_graph[1]]
    if not common:
        return False
    with open(directory / SHARED_FILE, "wb") as f:
        for k in common:
            offset = f.tell()
            f.write(k[2])
            for tensors in by_graph:
                tensor = tensors[k]
                set_external_data(tensor, SHARED_FILE, offset=offset, length=len(k[2]))
                tensor.data_location = onnx.TensorProto.EXTERNAL
                tensor.ClearField("raw_data")
    for name, graph in graphs.items():
        onnx.save(graph, str(directory / name))
    log.info("%d weight(s) both graphs hold stored once in %s", len(common), SHARED_FILE)
    return True


def onnx_config(
    loaded: LoadedModel,
    quantization: str,
    decoding: dict[str, Any],
    sha256: str,
    shared: bool = False,
) -> dict[str, Any]:
    """The ``config.json`` of an export (its keys:
    docs/guide/ship.md#onnx-formatonnx-and-engineonnx)."""
    cfg, tok = loaded.model.config, loaded.tokenizer
    tags = {p: i for p, i in tok.tgt_tags.items() if i in tok.lang_tag_ids}
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "files": {
            "encoder": ENCODER_FILE,
            "decoder": DECODER_FILE,
            "shared": SHARED_FILE if shared else None,
        },
        "quantization": quantization,
        "opset": OPSET,
        "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        "src_lang": loaded.src_lang,
        "tgt_lang": loaded.tgt_lang,
        **languages_of(loaded.meta),
        "tags": tags,
        "lang_tag_ids": sorted(tok.lang_tag_ids),
        "tokenizer": {
            "src_model": "src.model",
            "tgt_model": None if tok.tgt_model_bytes is None else "tgt.model",
            "pieces": PIECES_FILE if tok.vocab is not None else None,
            "src_eos": tok.src_eos,
            "joint": tok.joint,
        },
        "decoding": decoding,
        "model": {
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "head_dim": cfg.head_dim,
            "n_encoder_layers": cfg.n_encoder_layers,
            "n_decoder_layers": cfg.n_decoder_layers,
            "src_vocab_size": cfg.src_vocab_size,
            "tgt_vocab_size": cfg.tgt_vocab_size,
            "max_positions": cfg.max_positions,
        },
        **graph_names(cfg.n_decoder_layers),
        "checkpoint_sha256": sha256,
        "model_config": cfg.to_dict(),
    }


def is_onnx_dir(path: str | Path) -> bool:
    """True when `path` is a directory written by `export_onnx`."""
    p = Path(path)
    if not (p / CONFIG_FILE).is_file() or not (p / DECODER_FILE).is_file():
        return False
    try:
        meta = json.loads((p / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME


def is_current_onnx_dir(path: str | Path) -> bool:
    """True when `path` is an ONNX export of this litmt's `FORMAT_VERSION` (a cache or a
    benchmark's export of another version is exported again)."""
    if not is_onnx_dir(path):
        return False
    meta = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
    return meta.get("format_version") == FORMAT_VERSION


def read_onnx_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of an ONNX export directory.

    Raises:
        ExportError: not an ONNX export, or written by another format version.
    """
    p = Path(path)
    if not is_onnx_dir(p):
        raise ExportError(
            f"{p} is not a litmt ONNX export (no {CONFIG_FILE} of format {FORMAT_NAME} and "
            f"{DECODER_FILE}); create one with scripts/export.py format=onnx"
        )
    meta = json.loads((p / CONFIG_FILE).read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise ExportError(
            f"{p} has ONNX format version {meta.get('format_version')}, this litmt reads "
            f"{FORMAT_VERSION}: export it again (scripts/export.py format=onnx)"
        )
    return meta


__all__ = [
    "CONFIG_FILE",
    "ONNX_QUANTIZATIONS",
    "cache_names",
    "check_onnx_exportable",
    "export_onnx",
    "graph_names",
    "import_onnx",
    "import_onnxruntime",
    "is_current_onnx_dir",
    "is_onnx_dir",
    "onnx_config",
    "read_onnx_config",
    "share_weights",
]
