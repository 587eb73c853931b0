"""`sparse`: fixed / strided block-sparse attention patterns (Child et al. 2019).

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim, P block size (tokens),
R query blocks, M key blocks attended per query block, S stride (in blocks).

The sequence is cut into blocks of P tokens. A (R, K) boolean layout says which key
blocks each query block attends (the union of the two factorised heads of the paper):

- ``strided``: the S blocks around the query block (|I - J| < S) and every S-th block
  before and after it ((I - J) mod S == 0).
- ``fixed``: every block of the query block's group of S blocks (I // S == J // S) and the
  last ``summary`` blocks of every group ("summary" blocks, J mod S >= S - summary).

Causal attention also drops blocks J > I and masks the future inside the diagonal block.
Each query block gathers only its M attended key blocks and runs one fused `sdpa` call, so
cost and memory are O(T · M · P), not O(T²). A layout that covers everything (stride at
least the number of blocks) is exactly full attention.
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
from litmt.errors import BackendError

SPARSE_MODES = ("fixed", "strided")


def layout_options(
    backend: str,
    mode: str | None,
    block_size: Any,
    stride: Any,
    summary: Any,
    *,
    prefix: str = "",
) -> tuple[int, int, int]:
    """Check the options of a block-sparse layout, for `sparse` and for flex's ``sparse_*``.

    Args:
        backend: the backend named in the errors.
        mode: one of `SPARSE_MODES`; None (flex only) = no sparse layout, whose numbers are
            then checked as integers only.
        block_size, stride, summary: tokens per block, stride in blocks, summary blocks.
        prefix: the options' name prefix in `backend` (flex: ``"sparse_"``).

    Returns:
        block_size, stride, summary as ints.

    Raises:
        BackendError: an unknown mode, a number below 1, or summary > stride.
    """
    if mode is not None and mode not in SPARSE_MODES:
        what, null = (f"{prefix.removesuffix('_')} mode", " or null") if prefix else ("mode", "")
        raise BackendError(
            f"attention backend '{backend}': unknown {what} '{mode}'; "
            f"valid modes: {', '.join(SPARSE_MODES)}{null}"
        )
    block_size, stride, summary = (
        int_option(prefix + name, value, backend, 1)
        for name, value in (("block_size", block_size), ("stride", stride), ("summary", summary))
    )
    if mode is not None and summary > stride:
        raise BackendError(
            f"attention backend '{backend}': {prefix}summary={summary} must not exceed "
            f"{prefix}stride={stride}"
        )
    return block_size, stride, summary


def block_layout(
    query_blocks: Tensor,
    n_key_blocks: int,
    *,
    mode: str,
    stride: int,
    summary: int = 1,
    causal: bool = False,
) -> Tensor:
    """Which key blocks each query block attends.

    Args:
        query_blocks: (R,) absolute block indices I of the queries.
        n_key_blocks: number of key blocks K (indices J = 0..K-1).
        mode: "fixed" or "strided".
        stride: S, in blocks.
        summary: summary blocks per group ("fixed" only).
        causal: also drop key blocks after the query block.

    Returns:
        (R, K) bool, True = attend.
    """
    i = query_blocks[:, None]  # (R, 1)
    j = torch.arange(n_key_blocks, device=query_blocks.device)[None, :]  # (1, K)
    if mode == "strided":
        layout = ((i - j).abs() < stride) | (torch.remainder(i - j, stride) == 0)
    elif mode == "fixed":
        layout = (i // stride == j // stride) | (torch.remainder(j, stride) >= stride - summary)
    else:  # pragma: no cover - validated in __init__
        raise ValueError(mode)
    if causal:
        layout = layout & (j <= i)
    return layout


class SparseAttention(AttentionKernel):
    """Block-sparse attention with a fixed or strided layout.

    Args:
        mode: "fixed" (local groups + summary blocks) or "strided" (local + every S-th).
        block_size: P, tokens per block.
        stride: S, in blocks (the group size for "fixed", the step for "strided").
        summary: summary blocks per group for "fixed" (1 <= summary <= stride).
    """

    name = "sparse"
    support = BackendSupport(
        exact=False,
        weights=True,
        cross=False,  # a layout over positions of another sequence means nothing
        notes="Child et al. 2019 fixed/strided block-sparse layouts; gathers attended blocks",
    )

    def __init__(
        self,
        mode: str = "fixed",
        block_size: int = 64,
        stride: int = 4,
        summary: int = 1,
        **unknown: Any,
    ) -> None:
        super().__init__()
        reject_unknown_options(self.name, unknown, ("mode", "block_size", "stride", "summary"))
        self.mode = mode
        self.block_size, self.stride, self.summary = layout_options(
            self.name, mode, block_size, stride, summary
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
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D); return (B, Tq, H, D).

        Positions are absolute: query i sits at Tk - Tq + i (a decode step with a cache).
        """
        b, tq, h, d = q.shape
        tk, p, dev = k.size(1), self.block_size, q.device
        offset = tk - tq
        if offset < 0:
            raise ValueError(f"sparse attention needs Tq <= Tk, got {tq} > {tk}")
        lead = offset % p  # queries are left-padded so that blocks align with key blocks
        first = offset // p  # absolute block index of the first query block
        r = -(-(lead + tq) // p)  # query blocks R
        kb = -(-tk // p)  # key blocks K

        layout = block_layout(
            first + torch.arange(r, device=dev),
            kb,
            mode=self.mode,
            stride=self.stride,
            summary=self.summary,
            causal=causal,
        )  # (R, K)
        m = int(layout.sum(dim=1).max())  # key blocks per query block M
        # Attended block indices first (stable sort keeps them in order), then filler.
        idx = torch.argsort((~layout).to(torch.int8), dim=1, stable=True)[:, :m]  # (R, M)
        block_ok = layout.gather(1, idx)  # (R, M)

        pad_k = (0, 0, 0, 0, 0, kb * p - tk)
        kg = F.pad(k, pad_k).view(b, kb, p, h, d)[:, idx]  # (B, R, M, P, H, D)
        vg = F.pad(v, pad_k).view(b, kb, p, h, d)[:, idx]
        kg = kg.permute(0, 1, 4, 2, 3, 5).reshape(b * r, h, m * p, d)  # (B*R, H, M*P, D)
        vg = vg.permute(0, 1, 4, 2, 3, 5).reshape(b * r, h, m * p, d)

        kpos = (idx[:, :, None] * p + torch.arange(p, device=dev)).reshape(r, m * p)  # (R, M*P)
        ok = block_ok.repeat_interleave(p, dim=1) & (kpos < tk)  # (R, M*P)
        kpm = safe_padding_mask(key_padding_mask)
        if kpm is not None:
            valid = F.pad(~kpm, (0, kb * p - tk), value=False)  # (B, K*P)
            ok = ok & valid[:, kpos]  # (B, R, M*P)
        else:
            ok = ok.expand(b, r, m * p)
        mask = ok[:, :, None, :]  # (B, R, 1, M*P)
        if causal:
            qpos = (first + torch.arange(r, device=dev))[:, None] * p + torch.arange(p, device=dev)
            mask = mask & (kpos[:, None, :] <= qpos[:, :, None])  # (B, R, P, M*P)
        mask = mask.expand(b, r, p, m * p)
        mask = mask | ~mask.any(dim=-1, keepdim=True)  # no empty rows: finite, never NaN
        mask = mask.reshape(b * r, 1, p, m * p)

        qp = F.pad(q, (0, 0, 0, 0, lead, r * p - lead - tq))  # (B, R*P, H, D)
        qc = qp.view(b, r, p, h, d).transpose(2, 3).reshape(b * r, h, p, d)  # (B*R, H, P, D)
        out = F.scaled_dot_product_attention(
            qc, kg, vg, attn_mask=mask, dropout_p=dropout_p
        )  # (B*R, H, P, D)
        out = out.view(b, r, h, p, d).transpose(2, 3).reshape(b, r * p, h, d)  # (B, R*P, H, D)
        return out[:, lead : lead + tq]

    def allowed_keys(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """The layout as a dense (B or 1, 1, Tq, Tk) token mask, for `forward_with_weights`.

        O(Tq · Tk): for heatmaps. A query with no real key in its layout (a padded position)
        ignores padding here; `forward` gives such rows other, equally unused, values.
        """
        tq, tk, p = q.size(1), k.size(1), self.block_size
        if tk < tq:
            raise ValueError(f"sparse attention needs Tq <= Tk, got {tq} > {tk}")
        pos = torch.arange(tq, device=q.device) + (tk - tq)  # (Tq,) absolute positions
        j = torch.arange(tk, device=q.device)  # (Tk,)
        layout = block_layout(
            pos // p,
            -(-tk // p),
            mode=self.mode,
            stride=self.stride,
            summary=self.summary,
            causal=causal,
        )  # (Tq, K): key blocks of each query's block
        pattern = layout[:, j // p]  # (Tq, Tk)
        if causal:
            pattern = pattern & (j[None, :] <= pos[:, None])
        return pattern_without_padding(pattern, pad)

    def extra_repr(self) -> str:
        return (
            f"name={self.name}, mode={self.mode}, block_size={self.block_size}, "
            f"stride={self.stride}, summary={self.summary}"
        )
