"""Three rules of the fused libraries that litmt's call sites must follow (issue 23).

- The device: libraries allocate on the *current* CUDA device (TE ``utils.py``
  ``get_cu_seqlens``: ``torch.zeros(1, device="cuda")`` concatenated with lengths on the
  mask's device), so every flash / xFormers / TE call runs under q's device.
- TE's training flag: ``DotProductAttention.forward`` passes ``is_training=self.training``
  to ``get_attention_backend``, which drops backends that cannot run a backward. A training
  step must run TE in training mode even without attention dropout.
- Padded rows: TE's cuDNN fused backend zeroes O only for THD (``attention.cpp``
  ``fused_attn_fwd``), so padded query rows of a bshd self-attention hold garbage. litmt
  zeroes them: encoder memory at padded source positions is read (with weight 0) by a
  cross-attention of another kernel, and 0 · NaN is NaN.

Each test fails on the code before the fix; the failures are in the commit message.
"""

from __future__ import annotations

import pytest
import torch
from tiny_model import tiny_config

from litmt.attention import build_backend, get_backend_class
from litmt.models import Seq2SeqTransformer
from litmt.models.config import AttentionConfig

from . import allow_cpu_fp32, current_device
from . import flash_attn as flash_emulation
from . import transformer_engine as te_emulation
from . import xformers as xformers_emulation
from .test_call_sites import ragged_sources

EMULATIONS = {"flash": flash_emulation, "xformers": xformers_emulation, "te": te_emulation}
LIBRARY_CALLS = {"flash": ("_func", "_varlen"), "xformers": ("_attend",), "te": ()}


def fused_kernel(backend: str, monkeypatch: pytest.MonkeyPatch, *, self_attention: bool):
    EMULATIONS[backend].install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class(backend))
    kernel = build_backend(backend)
    kernel.set_site("encoder_self" if self_attention else "cross", self_attention=self_attention)
    return kernel


def qkv_and_padding(lengths: list[int], t: int, h: int = 2, d: int = 8):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(lengths), t, h, d, generator=gen) for _ in range(3))
    pad = torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T), True = pad
    return q, k, v, pad


@pytest.mark.parametrize("backend", list(EMULATIONS))
def test_library_calls_run_on_the_device_of_q(backend, monkeypatch):
    kernel = fused_kernel(backend, monkeypatch, self_attention=True)
    seen: list[torch.device] = []
    for name in LIBRARY_CALLS[backend]:  # record the current device at each library call
        fn = getattr(kernel, name)

        def recording(*args, _fn=fn, **kwargs):
            seen.append(current_device())
            return _fn(*args, **kwargs)

        monkeypatch.setattr(kernel, name, recording)
    q, k, v, pad = qkv_and_padding([5, 2, 3], 5)
    for causal in (False, True):
        for kpm in (None, pad):
            kernel(q, k, v, key_padding_mask=kpm, causal=causal)  # TE: raises off-device
    if backend == "te":
        assert len(te_emulation.CALLS) == 4
    else:
        assert seen and all(dev == q.device for dev in seen), seen


def test_te_training_step_without_attention_dropout_runs_te_in_training_mode(monkeypatch):
    te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class("te"))
    torch.manual_seed(0)
    cfg = tiny_config(
        src_vocab_size=24, d_model=16, n_heads=2, d_ff=32, max_positions=32,
        attention_dropout=0.0, attention=AttentionConfig(encoder_self="te", decoder_self="te", cross="te"),
    )  # fmt: skip
    model = Seq2SeqTransformer(cfg).train()
    src = ragged_sources([5, 3])
    tgt = ragged_sources([4, 4])
    model(src, tgt).float().sum().backward()  # a training step, attention dropout 0
    assert te_emulation.CALLS and all(c.is_training for c in te_emulation.CALLS)
    te_emulation.CALLS.clear()
    with torch.no_grad():
        model.eval()(src, tgt)  # inference: no backward follows
    assert te_emulation.CALLS and not any(c.is_training for c in te_emulation.CALLS)


@pytest.mark.parametrize("backend", list(EMULATIONS))
@pytest.mark.parametrize("causal", [False, True])
def test_padded_query_rows_of_self_attention_are_zero(backend, causal, monkeypatch):
    kernel = fused_kernel(backend, monkeypatch, self_attention=True)
    q, k, v, pad = qkv_and_padding([5, 2, 3], 5)
    out = kernel(q, k, v, key_padding_mask=pad, causal=causal)  # (B, T, H, D)
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    ref = build_backend("math")(q, k, v, key_padding_mask=pad, causal=causal)
    torch.testing.assert_close(out[~pad], ref[~pad], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cross", ["math", "sdpa"])
def test_te_encoder_memory_feeds_another_cross_kernel_without_nan(cross, monkeypatch):
    """te in the encoder, `cross` at the cross site: padded memory rows must be finite."""
    te_emulation.install(monkeypatch, allow_cpu_fp32=True)
    allow_cpu_fp32(monkeypatch, get_backend_class("te"))
    models = []
    for encoder_self in ("te", "math"):
        torch.manual_seed(0)
        cfg = tiny_config(
            src_vocab_size=24, d_model=16, n_heads=2, d_ff=32, max_positions=32,
            attention=AttentionConfig(encoder_self=encoder_self, decoder_self="math", cross=cross),
        )  # fmt: skip
        models.append(Seq2SeqTransformer(cfg).eval())
    model, reference = models
    reference.load_state_dict(model.state_dict())
    src = ragged_sources([6, 3, 4, 1])
    tgt = ragged_sources([5, 5, 5, 5])
    with torch.no_grad():
        memory, _ = model.encode(src)  # (B, S, E)
        assert torch.isfinite(memory).all()
        logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    with torch.no_grad():
        torch.testing.assert_close(logits, reference(src, tgt), atol=1e-5, rtol=1e-5)


def test_device_context_is_torch_cuda_device_on_cuda_and_nothing_elsewhere():
    """The helper the emulations stand in for (constructing it does not touch CUDA)."""
    from litmt.attention.base import device_context

    ctx = device_context(torch.device("cuda", 1))
    assert isinstance(ctx, torch.cuda.device) and ctx.idx == 1
    with device_context(torch.device("cpu")):
        pass
