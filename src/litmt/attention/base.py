"""The attention-kernel contract: `AttentionKernel`, and `FusedKernel` / `PackedKernel` for
library kernels.

Letters used in shapes: B batch, Tq query length, Tk key length, H heads, D head dim.

A kernel is a parameter-free ``nn.Module`` called as::

    kernel(q, k, v, *, key_padding_mask=None, causal=False, dropout_p=0.0) -> out
      q: (B, Tq, H, D)   k, v: (B, Tk, H, D)   out: (B, Tq, H, D)
      key_padding_mask: (B, Tk) bool, True = padding (gets no attention), or None
      causal: query i sees keys j <= i (only meaningful when Tq == Tk)

Because kernels own no weights, a checkpoint trained with one exact backend runs with any
other.

Two more methods complete the contract (both have defaults here):

- ``kernel.forward_with_weights(q, k, v, ...) -> (out, weights)``: the weights (B, H, Tq,
  Tk) the kernel applies, for heatmaps, and out = weights · V. Kernels that declare
  ``support.weights`` return their own: softmax kernels describe their pattern in
  `allowed_keys` (`math`, `local`, `sparse`), `linear` overrides `attention_weights`; fused
  kernels fall back to `math` under the same mask (logged once).
- ``kernel.new_cache(capacity) -> DecodeCache``: the state a decoder self-attention layer
  keeps across incremental decode steps (see `litmt.attention.cache`). The default keeps
  every position's K/V; `local` keeps its window and `linear` its running sums.

The support declaration and its checks live in `litmt.attention.support`, the mask and
packing helpers in `litmt.attention.masks`; both are re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litmt.attention.cache import DecodeCache, KVCache
from litmt.attention.masks import (
    causal_mask,
    causal_padded_attention,
    pad_rows,
    pattern_without_padding,
    safe_padding_mask,
    unpad,
)
from litmt.attention.support import (
    ALL_DTYPES,
    HALF_DTYPES,
    AttentionRequest,
    BackendSupport,
    check_request,
    import_packages,
    int_option,
    package_problem,
    reject_unknown_options,
)
from litmt.errors import BackendError

__all__ = [
    "ALL_DTYPES",
    "HALF_DTYPES",
    "AttentionKernel",
    "AttentionRequest",
    "BackendSupport",
    "FusedKernel",
    "PackedKernel",
    "causal_mask",
    "causal_padded_attention",
    "device_context",
    "int_option",
    "pad_rows",
    "pattern_without_padding",
    "reject_unknown_options",
    "safe_padding_mask",
    "unpad",
]

log = logging.getLogger(__name__)


class AttentionKernel(nn.Module):
    """Base class of every backend. Subclasses set `name`, `support` and implement `forward`."""

    name: ClassVar[str] = "base"
    support: ClassVar[BackendSupport] = BackendSupport()

    def __init__(self, **options: Any) -> None:
        super().__init__()
        if options:
            raise BackendError(
                f"attention backend '{self.name}' takes no options, got {sorted(options)}"
            )
        self.import_packages()
        self.site = "attention"  # where the model uses this kernel (see `set_site`)
        self.self_attention: bool | None = None  # None: not told (standalone use)

    def set_site(self, site: str, *, self_attention: bool) -> None:
        """Told once by the layer that owns the kernel: its site, and whether queries and
        keys/values come from one sequence (self-attention) or two (cross-attention).

        Most kernels compute the same either way. `te` must know: for self-attention,
        Transformer Engine takes the query lengths from the key padding mask.
        """
        self.site, self.self_attention = site, self_attention

    # -- availability -------------------------------------------------------------------
    @classmethod
    def import_packages(cls) -> list[Any]:
        """Import the optional packages this backend needs (lazily), or raise `BackendError`
        saying whether a package is missing or installed but not usable."""
        return import_packages(cls.name, cls.support)

    @classmethod
    def unavailable(cls) -> tuple[str, str] | None:
        """None when this backend's packages import with every name it calls; else
        ("not installed", package) or ("not usable", "<what>: <Error>: <message>")."""
        return package_problem(cls.support)

    def validate(self, request: AttentionRequest) -> None:
        """Raise `BackendError` if this kernel cannot serve `request`."""
        check_request(self.name, self.support, request)

    def check_inputs(self, q: Tensor) -> None:
        """Refuse a tensor on a device type or in a dtype outside `support`, with a clear error.

        Fused library kernels call this first, so fp32 or CPU inputs fail with a message
        naming the fix rather than deep inside the library.
        """
        s = self.support
        if q.device.type not in s.devices or q.dtype not in s.dtypes:
            names = "/".join(str(d).replace("torch.", "") for d in s.dtypes)
            raise BackendError(
                f"attention backend '{self.name}' needs {'/'.join(s.devices)} {names} inputs, "
                f"got {str(q.dtype).replace('torch.', '')} on {q.device.type}; "
                "use attention=sdpa there"
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
        raise NotImplementedError

    def forward_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, Tensor]:
        """Like `forward`, but through the weights (B, H, Tq, Tk), which are returned too.

        out = dropout(weights) · V with the `attention_weights` of this kernel. For fused
        kernels (``support.weights`` False) those are `math`'s, under the same mask.
        """
        if not self.support.weights and self.name not in _WEIGHTS_FALLBACK_LOGGED:
            _WEIGHTS_FALLBACK_LOGGED.add(self.name)
            log.info(
                "attention backend '%s' is fused: its weights are recomputed with 'math' "
                "under the same mask",
                self.name,
            )
        weights = self.attention_weights(q, k, key_padding_mask, causal)  # (B, H, Tq, Tk)
        attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(attn, v.transpose(1, 2))  # (B, H, Tq, D)
        return out.transpose(1, 2), weights  # (B, Tq, H, D), (B, H, Tq, Tk)

    def attention_weights(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """The weight (B, H, Tq, Tk) each query gives each key, in q's dtype.

        This default is softmax(q kᵀ / √D) over the keys `allowed_keys` permits: the `math`
        reference, and `local` and `sparse` with their own masks. `linear` overrides it.

        Args:
            q: (B, Tq, H, D); k: (B, Tk, H, D); pad: (B, Tk) bool, True = padding, or None.
            causal: query i sees keys j <= i + Tk - Tq only.
        """
        qh, kh = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D)
        scores = torch.matmul(qh, kh.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B,H,Tq,Tk)
        allowed = self.allowed_keys(q, k, pad, causal)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        return torch.softmax(scores.float(), dim=-1).to(q.dtype)

    def allowed_keys(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """Where query i may see key j: bool, broadcastable to (B, H, Tq, Tk).

        Full attention: every real key (a fully padded row sees all, see
        `safe_padding_mask`), only j <= i + Tk - Tq when causal. Every row has a True.
        """
        tq, tk = q.size(1), k.size(1)
        allowed = (  # (Tq, Tk)
            causal_mask(tq, tk, q.device)
            if causal
            else torch.ones(tq, tk, dtype=torch.bool, device=q.device)
        )
        kpm = safe_padding_mask(pad)
        if kpm is None:
            return allowed
        return allowed & ~kpm[:, None, None, :]  # (B, 1, Tq, Tk)

    def new_cache(self, capacity: int | None = None) -> DecodeCache:
        """The decode-time state of a causal self-attention layer using this kernel.

        Args:
            capacity: positions the search will decode at most (None: unknown).
        """
        return KVCache(self, capacity)

    def extra_repr(self) -> str:
        return f"name={self.name}"


_WEIGHTS_FALLBACK_LOGGED: set[str] = set()


def device_context(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make `device` CUDA's current device for a library call (nothing to do off CUDA).

    The libraries allocate some tensors on the *current* device, not the inputs' one
    (Transformer Engine ``get_cu_seqlens``: ``torch.zeros(1, device="cuda")``; xFormers
    ``_get_default_bias_device``), so a call on ``cuda:1`` with device 0 current fails.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


class FusedKernel(AttentionKernel):
    """A library kernel (`flash`, `xformers`, `te`): the shared `forward` around `attend`.

    `forward` refuses inputs outside `support` (`check_inputs`), un-masks fully padded rows
    (`safe_padding_mask`) and runs causal + padding with Tq != Tk (a chunk against a padded
    cache), which the libraries align differently, exactly through sdpa
    (`causal_padded_attention`). Every other call goes to the subclass's `attend`, under
    q's device (`device_context`); padded query rows of a self-attention come back as 0.
    """

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, kpm: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        """The library call: q (B, Tq, H, D), k, v (B, Tk, H, D), kpm (B, Tk) True = padding
        (never a fully padded row) or None; returns (B, Tq, H, D)."""
        raise NotImplementedError

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
        kpm = safe_padding_mask(key_padding_mask)
        if kpm is not None and causal and q.size(1) != k.size(1):
            return causal_padded_attention(q, k, v, ~kpm, dropout_p)
        with device_context(q.device):
            out = self.attend(q, k, v, kpm, causal, dropout_p)  # (B, Tq, H, D)
        if kpm is not None and q.size(1) == k.size(1) and (causal or self.self_attention):
            # Padded query rows of a self-attention: a library may leave them uninitialised
            # (TE's cuDNN path for bshd). They become encoder memory that a cross-attention
            # reads with weight 0, and 0 * NaN = NaN: zero them.
            out = out.masked_fill(kpm[:, :, None, None], 0.0)
        return out


class PackedKernel(FusedKernel):
    """A fused kernel that serves key padding by packing the real rows (`unpad`).

    The shared `attend` of `flash` and `xformers`; a subclass supplies three library calls:

    - `dense`: no padding mask, the (B, T, H, D) tensors as they are;
    - `packed_keys`: padding, not causal: every query row against its own row's packed keys;
    - `packed_causal`: causal + padding (self-attention): queries packed like the keys, so
      query i still sees exactly the real keys j <= i; padded query rows return 0.

    N below is the number of real (non-padding) keys.
    """

    def dense(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> Tensor:
        """No padding: q (B, Tq, H, D), k, v (B, Tk, H, D) -> (B, Tq, H, D)."""
        raise NotImplementedError

    def packed_keys(
        self, q: Tensor, k: Tensor, v: Tensor, cu_k: Tensor, max_k: int, dropout_p: float
    ) -> Tensor:
        """q (B, Tq, H, D) over packed k, v (N, H, D), row b's keys at cu_k[b]:cu_k[b+1]
        (cu_k (B+1,) int32, longest row max_k); returns (B, Tq, H, D)."""
        raise NotImplementedError

    def packed_causal(
        self, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, max_len: int, dropout_p: float
    ) -> Tensor:
        """Causal attention of packed q, k, v (N, H, D) within each row of cu (B+1,); (N, H, D)."""
        raise NotImplementedError

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, kpm: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        """`dense` without padding, else the packed calls; returns (B, Tq, H, D)."""
        if kpm is None:
            return self.dense(q, k, v, causal, dropout_p)
        b, tq, h, d = q.shape
        tk = k.size(1)
        keep = ~kpm  # (B, Tk)
        k_p, index, cu_k, max_k = unpad(k, keep)  # (N, H, D)
        v_p = v.reshape(b * tk, h, d).index_select(0, index)  # (N, H, D)
        if not causal:
            return self.packed_keys(q, k_p, v_p, cu_k, max_k, dropout_p)
        q_p = q.reshape(b * tq, h, d).index_select(0, index)  # queries packed like the keys
        out_p = self.packed_causal(q_p, k_p, v_p, cu_k, max_k, dropout_p)  # (N, H, D)
        return pad_rows(out_p, index, b, tq)  # (B, Tq, H, D), padded rows 0
