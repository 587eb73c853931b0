"""`local`: sliding-window attention, query i sees keys j with |i - j| <= window.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, N query chunks, C chunk
length, W keys per chunk window (C + window + right reach).

The queries are cut into chunks of C positions. Chunk n only needs the keys from
``start - window`` to ``end + window`` (``end`` itself when causal), so every chunk attends
over a fixed window of W = C + 2·window (or C + window) keys with one fused ``sdpa`` call
over all chunks. Cost and memory are O(T · W) instead of O(T²); no (T, T) mask is built.

Positions are absolute: with Tq != Tk (a decoder step against a cache) query i sits at
position ``Tk - Tq + i``, so a one-token step sees only the last ``window + 1`` keys. The
decode cache (`WindowCache`) therefore keeps only the last ``window`` keys: O(window) per
step, however long the output grows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import (
    AttentionKernel,
    BackendSupport,
    int_option,
    pattern_without_padding,
    reject_unknown_options,
    safe_padding_mask,
)
from litmt.attention.cache import DecodeCache

_MIN_CHUNK = 64  # chunks shorter than this waste time on per-chunk overhead


class LocalAttention(AttentionKernel):
    """Sliding-window attention (Beltagy et al. 2020 style), bidirectional or causal.

    Args:
        window: half-width w; query i attends keys j with i - w <= j <= i + w (j <= i when
            causal). ``window >= T`` is exactly full attention.
        chunk_size: query chunk length C (default max(window, 64)); only a speed knob.
    """

    name = "local"
    support = BackendSupport(
        exact=False,
        weights=True,
        cross=False,  # a window over positions of another sequence means nothing
        notes="sliding window |i-j| <= window; O(T*window) time and memory via query chunks",
    )

    def __init__(self, window: int = 128, chunk_size: int | None = None, **unknown: Any) -> None:
        super().__init__()
        reject_unknown_options(self.name, unknown, ("window", "chunk_size"))
        self.window = int_option("window", window, self.name, 0)
        self.chunk_size = (
            None if chunk_size is None else int_option("chunk_size", chunk_size, self.name, 1)
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
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D) in a window; (B, Tq, H, D)."""
        b, tq, h, d = q.shape
        tk = k.size(1)
        w = self.window
        right = 0 if causal else w  # how far to the right a query may look
        offset = tk - tq  # absolute position of query 0
        c = max(1, min(self.chunk_size or max(w, _MIN_CHUNK), tq))
        n = -(-tq // c)  # number of query chunks N
        win = c + w + right  # keys per chunk window W

        # Key validity over absolute positions (False = padding or outside [0, Tk)).
        kpm = safe_padding_mask(key_padding_mask)
        valid = (
            torch.ones(b, tk, dtype=torch.bool, device=q.device) if kpm is None else ~kpm
        )  # (B, Tk)
        # Padded key index t <-> absolute key position t - pad_left. Chunk n's window starts
        # at position offset + n*C - w, i.e. at padded index start + n*C.
        pad_left = max(0, w - offset)
        start = offset - w + pad_left  # >= 0
        need = start + (n - 1) * c + win  # padded length the windows reach
        pad_right = max(0, need - (pad_left + tk))
        kv_pad = (0, 0, 0, 0, pad_left, pad_right)  # pad dim 1 of (B, T, H, D)
        kp = F.pad(k, kv_pad)[:, start:need]  # (B, need - start, H, D)
        vp = F.pad(v, kv_pad)[:, start:need]
        validp = F.pad(valid, (pad_left, pad_right), value=False)[:, start:need]

        # (B, N, H, D, W) -> (B, N, H, W, D) -> (B*N, H, W, D)
        kw = kp.unfold(1, win, c).permute(0, 1, 2, 4, 3).reshape(b * n, h, win, d)
        vw = vp.unfold(1, win, c).permute(0, 1, 2, 4, 3).reshape(b * n, h, win, d)
        valid_w = validp.unfold(1, win, c)  # (B, N, W)

        # Query a of a chunk and key slot j of its window: relative position j - w - a.
        a = torch.arange(c, device=q.device)[:, None]
        j = torch.arange(win, device=q.device)[None, :]
        band = (j >= a) & (j <= a + w + right)  # (C, W), the same for every chunk
        mask = band & valid_w[:, :, None, :]  # (B, N, C, W)
        # A row with nothing to attend to (a padded query) attends its whole window instead:
        # finite garbage, never NaN.
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        mask = mask.reshape(b * n, 1, c, win)  # (B*N, 1, C, W)

        qp = F.pad(q, (0, 0, 0, 0, 0, n * c - tq))  # (B, N*C, H, D)
        qc = qp.view(b, n, c, h, d).transpose(2, 3).reshape(b * n, h, c, d)  # (B*N, H, C, D)
        out = F.scaled_dot_product_attention(
            qc, kw, vw, attn_mask=mask, dropout_p=dropout_p
        )  # (B*N, H, C, D)
        out = out.view(b, n, h, c, d).transpose(2, 3).reshape(b, n * c, h, d)  # (B, N*C, H, D)
        return out[:, :tq]

    def allowed_keys(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """The window as a dense (B or 1, 1, Tq, Tk) mask, for `forward_with_weights`.

        O(Tq · Tk): for heatmaps, not for training. A query with no real key in its window
        (a padded position) attends its window ignoring padding here; `forward` gives such
        rows other, equally unused, values.
        """
        tq, tk = q.size(1), k.size(1)
        pos = torch.arange(tq, device=q.device)[:, None] + (tk - tq)  # (Tq, 1) absolute
        j = torch.arange(tk, device=q.device)[None, :]  # (1, Tk)
        band = (j >= pos - self.window) & (j <= (pos if causal else pos + self.window))
        return pattern_without_padding(band, pad)

    def new_cache(self, capacity: int | None = None) -> DecodeCache:
        """A `WindowCache`: only the last `window` keys are kept (`capacity` is not needed)."""
        return WindowCache(self)

    def extra_repr(self) -> str:
        return f"name={self.name}, window={self.window}, chunk_size={self.chunk_size}"


class WindowCache(DecodeCache):
    """Decode state of causal `local` attention: the last `window` keys and values.

    A new query at position t sees keys t - window ... t, so nothing older is needed. Each
    step concatenates the new positions to at most `window` kept ones and trims the rest:
    O(window) time and memory per step, whatever the decoded length.
    """

    def __init__(self, kernel: LocalAttention) -> None:
        self.kernel = kernel
        self.k: Tensor | None = None  # (B, <= window, H, D)
        self.v: Tensor | None = None

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """See `DecodeCache.attend`."""
        if self.k is not None and self.v is not None:
            k = torch.cat([self.k, k], dim=1)  # (B, kept + Tq, H, D)
            v = torch.cat([self.v, v], dim=1)
        out = self.kernel(q, k, v, causal=True)  # query i sits at position kept + i
        start = max(0, k.size(1) - self.kernel.window)
        self.k, self.v = k[:, start:], v[:, start:]
        return out

    def reorder(self, index: Tensor) -> None:
        """See `DecodeCache.reorder`."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
