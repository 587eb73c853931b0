"""The ``onnx`` engine: litmt's own searches over onnxruntime sessions of an ONNX export.

>>> from litmt.deploy.loader import load_translator
>>> load_translator("exports/en-de-onnx", engine="onnx").translate(["A man."], beam_size=5)

Division of work, as in the torch engine (`litmt.decoding.translator.Translator`): the text
side (input hygiene, directions, prefixes, n-best, `translate`) is
`litmt.decoding.translator_base.BaseTranslator`'s, and a batch is decoded by
`litmt.decoding.search.dispatch.decode`, so greedy, beam, n-best, sampling, prefixes and
constraints run litmt's search code unchanged. Only the model differs: `OnnxStepModel`
has the `StepModel` methods (``encode``, ``init_state``, ``decode_step``) and runs them in
the export's two onnxruntime sessions (`litmt.deploy.export.onnx`), with torch tensors in
and out.

The self-attention cache is the engine's (`SelfCache`, format 4 of the export): one torch
buffer per kind of every layer's keys and values with room for the next positions, bound to
the step by its memory. A step reads it where it lies and returns only the new position's
keys and values, which the next step writes in place; a beam search's reorder copies the
decoded positions of the rows it keeps into a second buffer once, at the next step. Every
input that lives in torch (tokens, the source ids, the cross-attention keys and values, the
cache) is bound by its memory, and the outputs (the logits, the new keys and values) are
written by onnxruntime into torch tensors: nothing is copied in or out of a step.

What the engine lacks: word alignments and the attention explorer (no torch model; use
engine=torch), GPUs (the CPU execution provider only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from litmt.data.tokenization.tokenizer import PAD_ID, Tokenizer
from litmt.decoding.config import DecodeConfig
from litmt.decoding.languages import Languages
from litmt.decoding.search.rules import Hypothesis
from litmt.decoding.translator import Translator, decode_request
from litmt.decoding.translator_base import DecodeRequest
from litmt.deploy.engines.cache import default_cache_dir
from litmt.deploy.export.base import file_sha256
from litmt.deploy.export.onnx import (
    cache_names,
    export_onnx,
    import_onnxruntime,
    is_current_onnx_dir,
    is_onnx_dir,
    read_onnx_config,
)
from litmt.errors import ConfigError
from litmt.models import TransformerConfig
from litmt.runtime.threads import check_threads

log = logging.getLogger("litmt.deploy.engines.onnx")


def default_onnx_cache_dir() -> Path:
    """Where engine=onnx exports a ``.ckpt`` on first use: ``$XDG_CACHE_HOME/litmt/onnx``."""
    return default_cache_dir("onnx")


class SelfCache:
    """The decoder's self-attention cache for an ONNX step (format 4): L layers, R rows, H
    heads, N capacity, D head dim.

    Every layer's keys, then its values, are one buffer (2L, R, H, N, D) whose first `length`
    positions hold the steps so far, zeros after them (the graph masks them, and zeros keep
    its masked products finite). A step's new keys and values are kept as they came out
    (`push`) and written at the next step (`inputs`): in place while the rows stay as they
    are, or, after a `reorder`, with the decoded positions of the kept rows copied once into
    the second buffer (two buffers take turns, so no step allocates one). The capacity grows
    in steps of `chunk` positions.

    Args:
        kinds: 2L (keys and values of every decoder layer).
        rows: R at the first step.
        heads: H.
        head_dim: D.
        chunk: positions added when the cache is full (the first capacity too).
    """

    def __init__(self, kinds: int, rows: int, heads: int, head_dim: int, chunk: int = 16):
        self.shape = (kinds, heads, head_dim)
        self.chunk = chunk
        self.buffer = self._zeros(rows, chunk)  # (2L, R, H, N, D)
        self.spare: Tensor | None = None  # the other buffer (its written part is stale)
        self.rows = rows
        self.length = 0
        self.pending: Tensor | None = None  # (2L, R0, H, 1, D): the last step's new keys, values
        self.index: Tensor | None = None  # (R,): the rows of `pending`/`buffer` kept; None = all

    def _zeros(self, rows: int, capacity: int) -> Tensor:
        kinds, heads, head_dim = self.shape
        return torch.zeros(kinds, rows, heads, capacity, head_dim)

    @property
    def capacity(self) -> int:
        """N: the positions the buffer holds."""
        return self.buffer.size(3)

    def reorder(self, index: Tensor) -> None:
        """Keep rows `index` (R',) in that order (copied at the next `inputs`)."""
        self.index = index if self.index is None else self.index.index_select(0, index)

    def push(self, new: Tensor) -> None:
        """The new position's keys and values (2L, R, H, 1, D) of the step that just ran."""
        self.pending = new

    def inputs(self) -> tuple[Tensor, int]:
        """The buffer the next step reads, (2L, R, H, N, D) (each [i] contiguous), and the
        positions it holds (``past_len``), after writing the pending step in."""
        if self.pending is None and self.index is None:
            return self.buffer[:, : self.rows], self.length
        index = self.index
        rows = self.rows if index is None else index.numel()
        length = self.length + (self.pending is not None)
        kept = index is None or torch.equal(index, torch.arange(rows))
        if kept and length <= self.capacity:  # rows in place (or a prefix): write the step
            if self.pending is not None:
                self.buffer[:, :rows, :, self.length] = self.pending[:, :rows, :, 0]
        else:  # move the rows (and grow) into the spare buffer
            capacity = max(self.capacity, -(-length // self.chunk) * self.chunk)
            spare = self.spare
            if spare is None or spare.size(1) < rows or spare.size(3) != capacity:
                spare = self._zeros(max(rows, self.buffer.size(1)), capacity)
            index = torch.arange(rows) if index is None else index
            n = self.length
            torch.index_select(self.buffer[:, :, :, :n], 1, index, out=spare[:, :rows, :, :n])
            if self.pending is not None:
                spare[:, :rows, :, n] = self.pending[:, :, :, 0].index_select(1, index)
            self.buffer, self.spare = spare, self.buffer
        self.rows, self.length = rows, length
        self.pending, self.index = None, None
        return self.buffer[:, :rows], length


@dataclass
class OnnxState:
    """The decoder state of the ONNX step: L layers, R rows, H heads, S source, D head dim.

    Attributes:
        src_ids: (R, S) source ids (the step masks their padding).
        cross: 2L tensors (R, H, S, D): every layer's cross-attention keys, then its values,
            from the encoder (the graph's ``cross_k_i``, ``cross_v_i`` order).
        cache: the self-attention cache (`SelfCache`).
    """

    src_ids: Tensor
    cross: list[Tensor]
    cache: SelfCache

    def reorder(self, index: Tensor, *, cross: bool = True) -> None:
        """Keep rows `index` (R',) in that order (`litmt.models.transformer.DecoderState`'s
        contract: ``cross=False`` leaves the source side as it is)."""
        self.cache.reorder(index)
        if cross:
            self.src_ids = self.src_ids.index_select(0, index)
            self.cross = [t.index_select(0, index) for t in self.cross]


def _np(t: Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


class OnnxStepModel:
    """A `litmt.decoding.search.rules.StepModel` over an export's onnxruntime sessions.

    Args:
        model_dir: an ONNX export directory.
        meta: its ``config.json``.
        threads: onnxruntime intra-op threads per session (0 = onnxruntime's default).
    """

    def __init__(self, model_dir: Path, meta: dict[str, Any], threads: int = 0) -> None:
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        if check_threads(threads) > 0:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # Between two decoder steps the search runs in torch on the same cores; onnxruntime's
        # workers spinning there for their next task took the cores from torch's threads and
        # made each step wait (measured on 2 cores: greedy 2.7x slower with spinning; notebook
        # 2026-12-05, "ONNX format 3"). Idle workers sleep instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        files = meta["files"]
        self.encoder = ort.InferenceSession(
            str(model_dir / files["encoder"]), options, providers=providers
        )
        self.decoder = ort.InferenceSession(
            str(model_dir / files["decoder"]), options, providers=providers
        )
        self.config = TransformerConfig.from_dict(meta["model_config"])
        self.pad_id = PAD_ID
        self.names = cache_names(self.config.n_decoder_layers)  # cross, past, new

    def encode(self, src: Tensor) -> tuple[OnnxState, Tensor]:
        """Run the encoder on src (B, S): the state's source side, and the padding mask."""
        cross = [torch.from_numpy(t) for t in self.encoder.run(None, {"src_ids": _np(src)})]
        cfg = self.config
        cache = SelfCache(len(self.names["past"]), src.size(0), cfg.n_heads, cfg.head_dim)
        return OnnxState(src, cross, cache), src.eq(self.pad_id)

    def init_state(
        self, memory: OnnxState, src_padding_mask: Tensor | None, capacity: int | None = None
    ) -> OnnxState:
        """The state `encode` made (its cache grows as the search goes: no capacity needed)."""
        return memory

    def decode_step(self, tokens: Tensor, state: OnnxState) -> Tensor:
        """One step: tokens (R,) -> logits (R, V); the new position's keys and values go into
        the state's cache (module docstring)."""
        cache, past_len = state.cache.inputs()  # (2L, R, H, N, D)
        rows = tokens.numel()
        logits = torch.empty(rows, self.config.tgt_vocab_size)
        kinds, _, heads, _, head_dim = cache.shape
        new = torch.empty(kinds, rows, heads, 1, head_dim)
        binding = self.decoder.io_binding()
        inputs = {  # numpy views of torch's memory: kept alive until the run is over
            "tokens": _np(tokens.view(-1)),
            "src_ids": _np(state.src_ids),
            "past_len": np.array([past_len], dtype=np.int64),
        }
        inputs |= {name: _np(t) for name, t in zip(self.names["cross"], state.cross, strict=True)}
        inputs |= {name: _np(cache[i]) for i, name in enumerate(self.names["past"])}
        for name, array in inputs.items():
            binding.bind_cpu_input(name, array)
        outputs = {"logits": logits} | dict(zip(self.names["new"], new, strict=True))
        for name, out in outputs.items():
            binding.bind_output(name, "cpu", 0, np.float32, tuple(out.shape), out.data_ptr())
        self.decoder.run_with_iobinding(binding)
        state.cache.push(new)
        return logits


class OnnxTranslator(Translator):
    """A `Translator` over an ONNX export (same `translate`/`search_ids` options).

    Args:
        model_dir: a directory written by `litmt.deploy.export.onnx.export_onnx`.
        threads: onnxruntime intra-op threads (the ``threads`` key; 0 = its default).
    """

    def __init__(self, model_dir: str | Path, *, threads: int = 0) -> None:
        self.model_dir = Path(model_dir)
        self.meta = read_onnx_config(self.model_dir)
        self.step_model = OnnxStepModel(self.model_dir, self.meta, threads)
        self.model, self.models = None, []  # no torch model (no alignments, no explorer)
        self.device = torch.device("cpu")
        self.autocast = None
        self.default_config = DecodeConfig.from_options(self.meta.get("decoding"))
        self.tokenizer = Tokenizer.load(self.model_dir)
        self.src_lang, self.tgt_lang = self.meta["src_lang"], self.meta["tgt_lang"]
        self.languages = Languages.from_meta(self.meta)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | None = None,
        threads: int = 0,
        quantization: str = "none",
        cache_dir: str | Path | None = None,
    ) -> OnnxTranslator:
        """From an export directory, or a ``.ckpt`` exported into `cache_dir` on first use
        (named by its sha256 and `quantization`)."""
        if device not in (None, "cpu", "auto"):
            raise ConfigError(f"engine=onnx runs on the CPU; device={device} is not supported")
        p = Path(path)
        if not is_onnx_dir(p):
            if p.is_dir():
                read_onnx_config(p)  # raises: a directory that is not an ONNX export
            if not p.is_file():
                raise ConfigError(f"model not found: {p} (give a .ckpt file or an ONNX export)")
            target = Path(cache_dir or default_onnx_cache_dir())
            target = target / f"{p.stem}-{file_sha256(p)[:16]}-{quantization}"
            if not is_current_onnx_dir(target):  # first use, or a cache of another version
                log.info("exporting %s for engine=onnx into %s", p, target)
                export_onnx(p, target, quantization=quantization, force=True)
            p = target
        return cls(p, threads=threads)

    @property
    def max_source_tokens(self) -> int:
        """Longest source the model accepts (its `max_positions`)."""
        return int(self.meta["model"]["max_positions"])

    @property
    def engine(self) -> str:
        return "onnx"

    def decode_batches(
        self, request: DecodeRequest
    ) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
        """`decode` of ``request.todo`` over the ONNX step model, in token-budget batches
        (with constraints, grouped by beam: `by_beam`), as the torch engine does."""
        yield from decode_request(self, self.step_model, request, PAD_ID)


__all__ = [
    "OnnxState",
    "OnnxStepModel",
    "OnnxTranslator",
    "SelfCache",
    "default_onnx_cache_dir",
]
