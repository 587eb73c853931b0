"""litmt's real call sites through the emulated flash-attn, xFormers and Transformer Engine.

The model, the searches and the backends run their real code on CPU in fp32; only the
library underneath is the emulation (see this package's docstring). Every kernel call is
compared, query row by query row, with `math` on the same q, k, v: all rows at the cross
site, and at self-attention sites all rows except padded query positions (the contract
leaves those free; the packed paths return 0 there).

These tests catch the `te` defect of choosing "self" from Tq == Tk at the cross site:
Transformer Engine then takes the query lengths from the source mask and zeroes every
target row at or past that sentence's source length.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from tiny_model import tiny_config

from litmt.attention import build_backend, get_backend_class
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.decoding.search.beam import beam_search
from litmt.decoding.search.greedy import greedy_search
from litmt.models import Seq2SeqTransformer
from litmt.models.config import AttentionConfig
from litmt.models.mha import MultiHeadAttention

from . import allow_cpu_fp32
from . import flash_attn as flash_emulation
from . import transformer_engine as te_emulation
from . import xformers as xformers_emulation

EMULATIONS = {"flash": flash_emulation, "xformers": xformers_emulation, "te": te_emulation}


@dataclass
class CheckedCall:
    site: str
    tq: int
    tk: int
    padding: bool
    causal: bool


def install_checked(monkeypatch: pytest.MonkeyPatch, backend: str) -> list[CheckedCall]:
    """Install the emulation of `backend` and compare every call of its kernel with `math`."""
    EMULATIONS[backend].install(monkeypatch, allow_cpu_fp32=True)
    cls = get_backend_class(backend)
    allow_cpu_fp32(monkeypatch, cls)
    real_forward = cls.forward
    reference = build_backend("math")
    calls: list[CheckedCall] = []

    def checked(self, q, k, v, *, key_padding_mask=None, causal=False, dropout_p=0.0):
        out = real_forward(
            self, q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p
        )
        ref = reference(q, k, v, key_padding_mask=key_padding_mask, causal=causal)
        b, tq = q.shape[:2]
        rows = torch.ones(b, tq, dtype=torch.bool)
        site = SITES.get(id(self), "unknown")
        if site != "cross" and key_padding_mask is not None and tq == k.size(1):
            rows = ~key_padding_mask  # padded positions of a self-attention sequence
        calls.append(CheckedCall(site, tq, k.size(1), key_padding_mask is not None, causal))
        torch.testing.assert_close(
            out[rows], ref[rows], atol=1e-5, rtol=1e-5, msg=lambda m: f"{backend} at {site}: {m}"
        )
        return out

    monkeypatch.setattr(cls, "forward", checked)
    return calls


SITES: dict[int, str] = {}  # id(kernel) -> its site (kernels of every model built here)


def tiny_model(backend: str, vocab: int = 24) -> Seq2SeqTransformer:
    """A 2-layer model with `backend` at every site (D = 8: flash needs a multiple of 8)."""
    torch.manual_seed(0)
    cfg = tiny_config(
        src_vocab_size=vocab,
        d_model=16,
        n_heads=2,
        d_ff=32,
        max_positions=32,
        attention=AttentionConfig(encoder_self=backend, decoder_self=backend, cross=backend),
    )
    model = Seq2SeqTransformer(cfg).eval()
    SITES.update(
        {id(m.kernel): m.site for m in model.modules() if isinstance(m, MultiHeadAttention)}
    )
    return model


def models(backend: str) -> tuple[Seq2SeqTransformer, Seq2SeqTransformer]:
    """The model with `backend` everywhere, and the same weights with `math` everywhere."""
    model, reference = tiny_model(backend), tiny_model("math")
    reference.load_state_dict(model.state_dict())
    return model, reference


def ragged_sources(lengths: list[int], vocab: int = 24) -> torch.Tensor:
    """(B, S) right-padded sources of the given lengths (eos last), S = max(lengths)."""
    gen = torch.Generator().manual_seed(1)
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=gen)
        src[i, n - 1] = EOS_ID
    return src


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_forward_with_ragged_sources_and_tq_equal_tk_at_the_cross_site(backend, monkeypatch):
    calls = install_checked(monkeypatch, backend)
    model, reference = models(backend)
    src = ragged_sources([6, 3, 4, 1])  # S = 6
    tgt_in = torch.randint(4, 24, (4, 6), generator=torch.Generator().manual_seed(2))
    tgt_in[:, 0] = BOS_ID  # T = 6 = S: the case that fooled a shape-based self/cross choice
    with torch.no_grad():
        logits = model(src, tgt_in)
        torch.testing.assert_close(logits, reference(src, tgt_in), atol=1e-5, rtol=1e-5)
    cross = [c for c in calls if c.site == "cross"]
    assert len(cross) == 2 and all(c.tq == c.tk == 6 and c.padding for c in cross)


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_beam_search_with_beam_size_equal_to_source_length(backend, monkeypatch):
    calls = install_checked(monkeypatch, backend)
    model, reference = models(backend)
    src = ragged_sources([5, 2, 3])  # S = 5 = K
    with torch.no_grad():
        hyps = beam_search(model, src, beam_size=5, max_len_a=0.0, max_len_b=6)
        ref = beam_search(reference, src, beam_size=5, max_len_a=0.0, max_len_b=6)
    assert [[h.tokens for h in row] for row in hyps] == [[h.tokens for h in row] for row in ref]
    assert {c.site for c in calls} == {"encoder_self", "decoder_self", "cross"}


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_cached_greedy_decode_matches_math(backend, monkeypatch):
    """Incremental decoding with the KV cache, including 1-token sources (Tq == Tk == 1)."""
    calls = install_checked(monkeypatch, backend)
    model, reference = models(backend)
    for src in (ragged_sources([4, 1, 2]), ragged_sources([1, 1])):
        with torch.no_grad():
            hyps = greedy_search(model, src, max_len_a=0.0, max_len_b=5)
            ref = greedy_search(reference, src, max_len_a=0.0, max_len_b=5)
        assert [h.tokens for h in hyps] == [h.tokens for h in ref]
    assert any(c.site == "decoder_self" and c.tq == 1 and c.tk > 1 for c in calls)
    assert any(c.site == "cross" and c.tq == c.tk == 1 for c in calls)


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_decode_steps_give_the_logits_of_the_full_pass(backend, monkeypatch):
    install_checked(monkeypatch, backend)
    model, _ = models(backend)
    src = ragged_sources([5, 2, 5])
    tgt_in = torch.randint(4, 24, (3, 5), generator=torch.Generator().manual_seed(3))
    tgt_in[:, 0] = BOS_ID
    with torch.no_grad():
        full = model(src, tgt_in)  # (B, T, V)
        memory, mask = model.encode(src)
        state = model.init_state(memory, mask)
        for t in range(tgt_in.size(1)):
            step = model.decode_step(tgt_in[:, t], state)  # (B, V)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)
