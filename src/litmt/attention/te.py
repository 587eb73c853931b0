"""`te`: NVIDIA Transformer Engine's ``DotProductAttention`` (cuDNN fused / flash kernels).

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.

TE's module is built per (heads, head dim, dropout, attention type) on first use, because
a kernel does not know H and D until it sees q. It is kept out of ``state_dict`` (kernels
own no weights). Its defaults are set explicitly, never inherited: ``qkv_format="bshd"``
(our layout; TE's default is "sbhd") and ``attn_mask_type`` per call (TE's default is
"causal", wrong for an encoder):

| call                               | attention_type | attn_mask_type                  |
|------------------------------------|----------------|---------------------------------|
| encoder self, no padding           | self           | no_mask                         |
| encoder self, padding              | self           | padding (mask (B, 1, 1, T))     |
| decoder self (causal)              | self           | causal                          |
| decoder step (Tq != Tk), causal    | cross          | causal_bottom_right             |
| cross / decoder step, padding      | cross          | padding (masks (q, kv) tuple)   |

TE's mask convention is True = masked out, the same as our key_padding_mask. TE's padding
path turns masks into sequence lengths, so it assumes right padding (what the data
pipeline produces). Padded query rows return 0.

FP8: `fp8_autocast` wraps TE's autocast with a DelayedScaling recipe. Only TE modules run in
FP8 (the projections here are torch ``nn.Linear``); with ``fp8_dpa=True`` the attention
itself does. It needs an sm89+ GPU (Ada, Hopper).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

from litmt.attention.base import AttentionKernel, BackendSupport, safe_padding_mask
from litmt.errors import BackendError

HALF_DTYPES = (torch.float16, torch.bfloat16)
FP8_FORMATS = ("HYBRID", "E4M3")


class TEAttention(AttentionKernel):
    """Transformer Engine ``DotProductAttention`` with layout and mask type set per call."""

    name = "te"
    support = BackendSupport(
        devices=("cuda",),
        dtypes=HALF_DTYPES,
        packages=("transformer_engine.pytorch",),
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
        mod.train(dropout_p > 0)  # TE applies its dropout only in training mode
        return mod

    def check_inputs(self, q: Tensor) -> None:
        """Refuse inputs the kernel cannot take (not CUDA, not fp16/bf16) with a clear error."""
        if q.device.type != "cuda" or q.dtype not in HALF_DTYPES:
            raise BackendError(
                f"attention backend 'te' needs CUDA fp16/bf16 inputs, got {q.dtype} on "
                f"{q.device.type}; use attention=sdpa there"
            )

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D); return (B, Tq, H, D)."""
        self.check_inputs(q)
        b, tq, h, d = q.shape
        tk = k.size(1)
        attention_type = "self" if tq == tk else "cross"
        kpm = safe_padding_mask(key_padding_mask)
        mask: Tensor | tuple[Tensor, Tensor] | None = None
        if kpm is None:
            mask_type = "no_mask"
            if causal:
                mask_type = "causal" if tq == tk else "causal_bottom_right"
        else:
            kv_mask = kpm[:, None, None, :]  # (B, 1, 1, Tk), True = masked out
            if attention_type == "self":
                mask = kv_mask  # queries share the keys' padding
            else:
                q_mask = torch.zeros(b, 1, 1, tq, dtype=torch.bool, device=q.device)
                mask = (q_mask, kv_mask)
            mask_type = "padding"
            if causal:
                mask_type = "padding_causal" if tq == tk else "padding_causal_bottom_right"
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
