"""`te`: NVIDIA Transformer Engine's ``DotProductAttention`` (cuDNN fused / flash kernels).

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.

TE's module is built per (heads, head dim, dropout, attention type) on first use, because
a kernel does not know H and D until it sees q. It is kept out of ``state_dict`` (kernels
own no weights). Its defaults are set explicitly, never inherited: ``qkv_format="bshd"``
(our layout; TE's default is "sbhd") and ``attn_mask_type`` per call (TE's default is
"causal", wrong for an encoder).

Self or cross is chosen by the call site, never by the shapes. With
``attention_type="self"`` TE derives the *query* lengths from the one key mask
(TransformerEngine ``dot_product_attention.py``, ``DotProductAttention.forward``:
``cu_seqlens_q = get_cu_seqlens(attention_mask)`` and the same for ``cu_seqlens_kv``), so a
cross-attention call that happens to have Tq == Tk would lose every query row at or past
its source length. "self" is therefore used only where the model said the kernel serves a
self-attention site (`set_site`), or for causal calls (causal attention is self-attention
by the contract), and only when Tq == Tk (a decode step against a cache has Tq != Tk; TE
itself switches to "cross" under KV caching). Everything else runs as "cross", with the
query mask stated explicitly, which is correct at any site:

| call                                 | attention_type | attn_mask_type                   |
|--------------------------------------|----------------|----------------------------------|
| self site, Tq == Tk, no padding      | self           | no_mask                          |
| self site, Tq == Tk, padding         | self           | padding (mask (B, 1, 1, T))      |
| causal, Tq == Tk (decoder self)      | self           | causal / padding_causal          |
| causal, Tq != Tk (cached chunk)      | cross          | causal_bottom_right              |
| causal, Tq != Tk, padding            | (sdpa, exact)  | TE aligns to the real lengths    |
| cross site (any Tq, Tk), no padding  | cross          | no_mask                          |
| cross site or decode step, padding   | cross          | padding (masks (q all kept, kv)) |

TE's mask convention is True = masked out, the same as our key_padding_mask. TE's padding
path turns masks into sequence lengths (``get_cu_seqlens``), so it assumes right padding
(what the data pipeline produces). TE's cuDNN backend leaves padded query rows of a bshd
self-attention uninitialised (it zeroes O only for THD, ``attention.cpp``
``fused_attn_fwd``); `FusedKernel.forward` zeroes them.

Every call runs under q's CUDA device (`device_context`): ``get_cu_seqlens`` builds its
leading zero on ``"cuda"``, the current device. TE's ``is_training`` follows grad mode.

FP8: `fp8_autocast` wraps TE's autocast with a DelayedScaling recipe. Only TE modules run in
FP8 (the projections here are torch ``nn.Linear``); with ``fp8_dpa=True`` the attention
itself does. It needs an sm89+ GPU (Ada, Hopper).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from litmt.attention.base import HALF_DTYPES, BackendSupport, FusedKernel
from litmt.errors import BackendError

FP8_FORMATS = ("HYBRID", "E4M3")


class TEAttention(FusedKernel):
    """Transformer Engine ``DotProductAttention`` with layout, type and mask set per call."""

    name = "te"
    support = BackendSupport(
        devices=("cuda",),
        dtypes=HALF_DTYPES,
        packages=("transformer_engine.pytorch",),
        requires=("transformer_engine.pytorch:DotProductAttention",),
        extra="te",
        min_cuda_capability=(8, 0),
        notes="Transformer Engine DotProductAttention; CUDA sm80+, fp16/bf16; optional FP8",
    )

    def __init__(self) -> None:
        super().__init__()  # imports transformer_engine.pytorch or raises with the extra
        import transformer_engine.pytorch as te

        self._te = te
        # A plain dict, not child modules: nothing of TE's ends up in the state dict.
        self._modules_by_key: dict[tuple[Any, ...], Any] = {}

    def _module(self, h: int, d: int, dropout_p: float, attention_type: str) -> Any:
        key = (h, d, float(dropout_p), attention_type)
        mod = self._modules_by_key.get(key)
        if mod is None:
            mod = self._te.DotProductAttention(
                num_attention_heads=h,
                kv_channels=d,
                attention_dropout=float(dropout_p),
                qkv_format="bshd",  # (B, T, H, D); TE's default "sbhd" would be wrong
                attn_mask_type="no_mask",  # overridden per call; TE's default is "causal"
                attention_type=attention_type,
            )
            self._modules_by_key[key] = mod
        # TE's is_training (DotProductAttention.forward -> get_attention_backend) drops the
        # backends that cannot run a backward, and gates its dropout: on whenever a backward
        # may follow (grad mode), whatever the attention dropout.
        mod.train(dropout_p > 0 or torch.is_grad_enabled())
        return mod

    def attention_type(self, tq: int, tk: int, causal: bool) -> str:
        """TE's attention type for this call: "self" only for one sequence against itself."""
        one_sequence = causal or self.self_attention is True
        return "self" if one_sequence and tq == tk else "cross"

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, kpm: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        """``DotProductAttention`` with TE's mask type and mask for this call; (B, Tq, H, D)."""
        b, tq, h, d = q.shape
        tk = k.size(1)
        attention_type = self.attention_type(tq, tk, causal)
        mask: Tensor | tuple[Tensor, Tensor] | None = None
        if kpm is None:
            mask_type = "no_mask"
            if causal:
                mask_type = "causal" if tq == tk else "causal_bottom_right"
        else:  # causal only with Tq == Tk here (FusedKernel.forward)
            kv_mask = kpm[:, None, None, :]  # (B, 1, 1, Tk), True = masked out
            if attention_type == "self":
                mask = kv_mask  # queries are the keys: they share the padding
            else:  # every query row is real: say so instead of letting TE guess
                q_mask = torch.zeros(b, 1, 1, tq, dtype=torch.bool, device=q.device)
                mask = (q_mask, kv_mask)
            mask_type = "padding_causal" if causal else "padding"
        mod = self._module(h, d, dropout_p, attention_type)
        q, k, v = (t.contiguous() for t in (q, k, v))
        out = mod(q, k, v, attention_mask=mask, attn_mask_type=mask_type)  # (B, Tq, H*D)
        return out.view(b, tq, h, d)


def fp8_autocast(
    enabled: bool = True,
    *,
    fp8_format: str = "HYBRID",
    amax_history_len: int = 16,
    amax_compute_algo: str = "max",
    fp8_dpa: bool = False,
) -> contextlib.AbstractContextManager[Any]:
    """A context in which Transformer Engine modules run in FP8 (DelayedScaling recipe).

    Args:
        enabled: False returns a no-op context (TE is not even imported).
        fp8_format: "HYBRID" (E4M3 forward, E5M2 backward) or "E4M3".
        amax_history_len: steps of amax history used for the scaling factors.
        amax_compute_algo: "max" or "most_recent".
        fp8_dpa: also run `te` attention (DotProductAttention) in FP8.

    Raises:
        BackendError: TE is not installed, the format is unknown, or the GPU is older than sm89.
    """
    if not enabled:
        return contextlib.nullcontext()
    if fp8_format not in FP8_FORMATS:
        raise BackendError(
            f"unknown FP8 format '{fp8_format}'; valid formats: {', '.join(FP8_FORMATS)}"
        )
    TEAttention.import_packages()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise BackendError("FP8 training needs an sm89+ GPU (Ada or Hopper); disable fp8 there")
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(
        fp8_format=getattr(Format, fp8_format),
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
    )
    recipe.fp8_dpa = fp8_dpa
    if hasattr(te, "autocast"):  # TE >= 2.8
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)
