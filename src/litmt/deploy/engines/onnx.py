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

The self-attention cache never leaves onnxruntime: each step runs with an IOBinding
(``run_with_iobinding``) whose outputs ``new_self_k_i``/``new_self_v_i`` (one per decoder
layer) stay onnxruntime values (`OrtValue`) and are bound as the next step's
``self_k_i``/``self_v_i`` as they are. A beam search's reorder only composes the rows the
next step continues (`OnnxState.reorder`); that step first gathers them, in a one-``Gather``
onnxruntime session of its own (`OnnxStepModel.reorder_past`, whose arena reuses its
buffers), so a search whose rows do not move (sampling; greedy between the steps where it
drops finished rows) copies the cache only in the step's ``Concat``. The source side (the
source ids, the cross-attention keys and values) is kept once per sentence for all its beams,
and the graph reads it once for them (`OnnxState.group`). The inputs that live in torch
(tokens, the source side) are bound by their memory, without a copy; only the logits (R, V)
come back into torch.

What the engine lacks: word alignments and the attention explorer (no torch model; use
engine=torch), GPUs (the CPU execution provider only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
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
    OPSET,
    cache_names,
    export_onnx,
    import_onnx,
    import_onnxruntime,
    is_current_onnx_dir,
    is_onnx_dir,
    read_onnx_config,
)
from litmt.errors import ConfigError
from litmt.models import TransformerConfig
from litmt.runtime.threads import check_threads

log = logging.getLogger("litmt.deploy.engines.onnx")


# A search without a beam decodes a batch of more padded source tokens than this in equal
# parts of at most about this many (`litmt.decoding.batching.even_parts`). Each step's graph
# copies the rows' whole self-attention cache (the new position's concat), where engine=torch
# writes the new position in place, and in a batch of 4,096 tokens that copy outgrows the
# processor's caches; but a step also reads all the weights whatever its rows, so a part must
# stay large: equal parts, not a small remainder, and not below 2,048 tokens, where OPUS-MT
# size greedy lost to engine=torch on batches of 32 sentences split in two (0.96x against
# 1.16x unsplit). On test2016, greedy against engine=torch: recipe 1.06x at 1,024 and 1.03x
# at 2,048, OPUS-MT size 1.05x and 1.09x. Notebook 2026-12-05, "ONNX format 6". Beam search,
# which needs its batch for its products, keeps the caller's budget.
UNBEAMED_MAX_TOKENS = 2048


def default_onnx_cache_dir() -> Path:
    """Where engine=onnx exports a ``.ckpt`` on first use: ``$XDG_CACHE_HOME/litmt/onnx``."""
    return default_cache_dir("onnx")


@dataclass
class OnnxState:
    """The decoder state of the ONNX step: L layers, R rows, N sources, H heads, S source
    length, P past, D head dim.

    Attributes:
        src_ids: (N, S) source ids (the step masks their padding).
        cross: 2L tensors (N, H, S, D): every layer's cross-attention keys, then its values,
            from the encoder (the graph's ``cross_k_i``, ``cross_v_i`` order), once per source.
        past: 2L values (R0, H, P, D): the self-attention cache as the last step left it
            (onnxruntime values; empty before the first step).
        beam_index: (R,) the row of `past` each row continues (the next step gathers them
            when they `moved`).
        group: G = R / N, the rows of each source: rows n * G ... n * G + G - 1 read source n
            (a beam search's beams; 1 when rows and sources are one to one).
    """

    src_ids: Tensor
    cross: list[Tensor]
    past: list[Any]
    beam_index: Tensor
    group: int = 1
    # the decoder's IOBinding, reused step to step, and the numpy views of the source side
    # bound in it (None: bind them again at the next step, after the source side changed)
    binding: Any = field(default=None, repr=False)
    source_bound: dict[str, np.ndarray] | None = field(default=None, repr=False)

    def reorder(self, index: Tensor, *, cross: bool = True) -> None:
        """Keep rows `index` (R',) in that order (`litmt.models.transformer.DecoderState`'s
        contract: ``cross=False`` leaves the source side as it is, each row keeping its
        source). The cache is not touched: the next step gathers its rows (``beam_index``),
        unless they are the same rows in the same order.

        With ``cross=True`` the source side follows the rows: when the new rows come in runs
        of equal length G, one run per source (a beam search's fan-out to K beams, or a drop
        of whole sentences), the sources are kept once each (`group` = G, and no copy when
        they are the same sources in the same order); otherwise each row gets its own copy
        of its source (`group` = 1)."""
        self.beam_index = self.beam_index.index_select(0, index)
        if not cross:
            return
        source = torch.div(index, self.group, rounding_mode="floor")  # (R',) old source ids
        keep, self.group = _source_runs(source)
        if not torch.equal(keep, torch.arange(self.src_ids.size(0))):
            self.src_ids = self.src_ids.index_select(0, keep)
            self.cross = [t.index_select(0, keep) for t in self.cross]
            self.source_bound = None

    @property
    def moved(self) -> bool:
        """Whether the rows are other than the rows of `past` in their order (so the next step
        gathers them); False before the first step."""
        if not self.past:
            return False
        rows = self.beam_index.numel()
        same_rows = rows == self.past[0].shape()[0]
        return not (same_rows and torch.equal(self.beam_index, torch.arange(rows)))


def _source_runs(source: Tensor) -> tuple[Tensor, int]:
    """The sources (N,) and the group G of rows whose sources are `source` (R,): when
    `source` is N runs of G equal ids, each run's id and G; otherwise `source` itself and 1."""
    if source.numel() == 0:
        return source, 1
    other = source.ne(source[0]).nonzero()  # where the first run ends
    group = int(other[0, 0]) if other.numel() else source.numel()
    if group > 1 and source.numel() % group == 0:
        runs = source.view(-1, group)  # (N, G)
        if bool(runs.eq(runs[:, :1]).all()):
            return runs[:, 0].contiguous(), group
    return source, 1


def reorder_graph(names: list[str], heads: int, head_dim: int) -> bytes:
    """A serialized ONNX graph that gathers rows: ``beam_index`` int64 (R,) and the caches
    `names` float32 (R0, heads, P, head_dim) -> ``gathered_<name>`` (R, heads, P, head_dim),
    row r being row ``beam_index[r]`` (one ``Gather`` per cache)."""
    onnx = import_onnx()
    TensorProto, helper = onnx.TensorProto, onnx.helper

    def cache(name: str, rows: str) -> Any:
        return helper.make_tensor_value_info(
            name, TensorProto.FLOAT, [rows, heads, "past_len", head_dim]
        )

    graph = helper.make_graph(
        [helper.make_node("Gather", [n, "beam_index"], [f"gathered_{n}"], axis=0) for n in names],
        "reorder",
        [helper.make_tensor_value_info("beam_index", TensorProto.INT64, ["rows"])]
        + [cache(n, "past_rows") for n in names],
        [cache(f"gathered_{n}", "rows") for n in names],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = onnx.IR_VERSION_2023_5_5  # IR 9, read by onnxruntime >= 1.15
    onnx.checker.check_model(model)
    return model.SerializeToString()


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
        # Inside a run, onnxruntime's workers spin between its operators (waking a sleeping
        # worker for each of a step's ~100 small operators cost 4 % at beam 5 and 9 % greedy);
        # when the run returns they stop (``force_spinning_stop``), because between two
        # decoder steps the search runs in torch on the same cores, and workers spinning
        # there took the cores from torch's threads (greedy 2.7x slower when they spun on).
        # Notebook 2026-12-05, "ONNX format 5".
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")
        options.add_session_config_entry("session.force_spinning_stop", "1")
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
        self.reorder = ort.InferenceSession(
            reorder_graph(self.names["past"], self.config.n_heads, self.config.head_dim),
            options,
            providers=providers,
        )

    def encode(self, src: Tensor) -> tuple[OnnxState, Tensor]:
        """Run the encoder on src (B, S): the state's source side, and the padding mask."""
        cross = [torch.from_numpy(t) for t in self.encoder.run(None, {"src_ids": _np(src)})]
        return OnnxState(src, cross, [], torch.arange(src.size(0))), src.eq(self.pad_id)

    def init_state(
        self, memory: OnnxState, src_padding_mask: Tensor | None, capacity: int | None = None
    ) -> OnnxState:
        """The state `encode` made (its cache is empty; the capacity is not needed)."""
        return memory

    def decode_step(self, tokens: Tensor, state: OnnxState) -> Tensor:
        """One step: tokens (R,) -> logits (R, V); the state's cache grows by one position
        and stays in onnxruntime (module docstring)."""
        if state.binding is None:
            state.binding = self.decoder.io_binding()
        binding = state.binding
        if state.source_bound is None:  # the first step, or the source side changed
            # numpy views of torch's memory, kept alive (in the state) while they are bound
            state.source_bound = {"src_ids": _np(state.src_ids)} | {
                name: _np(t) for name, t in zip(self.names["cross"], state.cross, strict=True)
            }
            for name, array in state.source_bound.items():
                binding.bind_cpu_input(name, array)
        token_ids = _np(tokens.view(-1))  # kept alive until the run is over
        binding.bind_cpu_input("tokens", token_ids)
        if not state.past:  # the first step: an empty cache (R, H, 0, D)
            cfg = self.config
            empty = np.zeros((tokens.numel(), cfg.n_heads, 0, cfg.head_dim), dtype=np.float32)
            for name in self.names["past"]:
                binding.bind_cpu_input(name, empty)
        else:
            past = self.reorder_past(state) if state.moved else state.past
            for name, cache in zip(self.names["past"], past, strict=True):
                binding.bind_ortvalue_input(name, cache)
        for name in ("logits", *self.names["new"]):
            binding.bind_output(name, "cpu")
        self.decoder.run_with_iobinding(binding)
        logits, *state.past = binding.get_outputs()
        state.beam_index = torch.arange(tokens.numel())
        return torch.from_numpy(logits.numpy())

    def reorder_past(self, state: OnnxState) -> list[Any]:
        """The past's rows `state.beam_index` (R,), in that order: 2L onnxruntime values
        (R, H, P, D), gathered by the reorder session, the cache staying in onnxruntime."""
        binding = self.reorder.io_binding()
        index = _np(state.beam_index)  # kept alive until the run is over
        binding.bind_cpu_input("beam_index", index)
        for name, cache in zip(self.names["past"], state.past, strict=True):
            binding.bind_ortvalue_input(name, cache)
            binding.bind_output(f"gathered_{name}", "cpu")
        self.reorder.run_with_iobinding(binding)
        return binding.get_outputs()


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
        (with constraints, grouped by beam: `by_beam`), as the torch engine does; a search
        without a beam (greedy, sampling) splits a batch into equal parts of at most about
        `UNBEAMED_MAX_TOKENS`."""
        unbeamed = request.config.effective_method in ("greedy", "sample")
        part = UNBEAMED_MAX_TOKENS if unbeamed else None
        yield from decode_request(self, self.step_model, request, PAD_ID, part_tokens=part)


__all__ = [
    "OnnxState",
    "OnnxStepModel",
    "OnnxTranslator",
    "default_onnx_cache_dir",
    "reorder_graph",
]
