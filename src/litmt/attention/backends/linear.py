"""`linear`: kernelised linear attention (Katharopoulos et al. 2020), φ(x) = elu(x) + 1.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim (E the value dim, = D),
N chunks of C positions.

softmax(q·k) is replaced by the positive feature map φ, so

    out_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ  /  (φ(q_i)ᵀ Σ_j φ(k_j) + eps)

- non-causal: the sums run over all keys, computed once as φ(K)ᵀV (D x E) and Σ φ(K): O(T).
- causal: the sums run over j <= i. Chunked prefix sums: within a chunk of C positions the
  masked (C x C) product is formed directly; across chunks a running (D x E) state is
  carried by an exclusive cumulative sum. Memory O(T · D) (one D x E state per chunk).
- padding: padded keys get φ(k) = 0, so they add nothing to either sum.
- decoding: the causal sums are all a new position needs of the past, so the decode cache
  (`LinearState`) keeps S = Σ φ(k) vᵀ (D x E) and z = Σ φ(k) (D): O(1) per step in the
  decoded length.
- weights: the effective attention matrix is φ(q_i)ᵀφ(k_j) / (Σ_j' φ(q_i)ᵀφ(k_j') + eps)
  (`forward_with_weights`); its rows sum to 1 (up to eps) and it times V is the output.

It is not softmax attention (`exact=False`); it is compared with its own naive O(T²) formula.
Attention dropout does not exist here (no attention matrix), so it is declared unsupported.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.attention.base import (
    AttentionKernel,
    BackendSupport,
    causal_mask,
    int_option,
    reject_unknown_options,
    safe_padding_mask,
)
from litmt.attention.cache import DecodeCache


def feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 > 0, elementwise."""
    return F.elu(x) + 1.0


class LinearAttention(AttentionKernel):
    """Linear-time attention with the elu + 1 feature map.

    Args:
        chunk_size: chunk length C of the causal prefix-sum computation (speed knob only).
        eps: added to the normaliser, as in the paper.
    """

    name = "linear"
    support = BackendSupport(
        dropout=False,
        exact=False,
        weights=True,
        notes="phi(x)=elu(x)+1 kernel attention; O(T) time and memory, causal via chunked prefix sums",
    )

    def __init__(self, chunk_size: int = 64, eps: float = 1e-6, **unknown: Any) -> None:
        super().__init__()
        reject_unknown_options(self.name, unknown, ("chunk_size", "eps"))
        self.chunk_size = int_option("chunk_size", chunk_size, self.name, 1)
        self.eps = float(eps)

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

        With causal=True and Tq < Tk (a chunk decoded against a cache), query i sits at
        position Tk - Tq + i and sees every earlier key.
        """
        qf, kf = _features(q, k, key_padding_mask)
        vf = v.float()
        tq, tk = q.size(1), k.size(1)
        if not causal:
            kv = torch.einsum("bkhd,bkhe->bhde", kf, vf)  # (B, H, D, E)
            z = kf.sum(dim=1)  # (B, H, D)
            num = torch.einsum("bqhd,bhde->bqhe", qf, kv)  # (B, Tq, H, E)
            den = torch.einsum("bqhd,bhd->bqh", qf, z)  # (B, Tq, H)
        else:
            offset = tk - tq
            if offset < 0:
                raise ValueError(f"causal linear attention needs Tq <= Tk, got {tq} > {tk}")
            # Keys before the first query are seen by every query: an initial state.
            s0 = torch.einsum("bkhd,bkhe->bhde", kf[:, :offset], vf[:, :offset])  # (B,H,D,E)
            z0 = kf[:, :offset].sum(dim=1)  # (B, H, D)
            num, den = self._causal(qf, kf[:, offset:], vf[:, offset:], s0, z0)
        out = num / (den[..., None] + self.eps)  # (B, Tq, H, E)
        return out.to(q.dtype)

    def attention_weights(self, q: Tensor, k: Tensor, pad: Tensor | None, causal: bool) -> Tensor:
        """The explicit (B, H, Tq, Tk) weights of `forward` (O(Tq · Tk), for heatmaps).

        weights_ij = φ(q_i)ᵀφ(k_j) / (Σ_j' φ(q_i)ᵀφ(k_j') + eps), over j <= i + Tk - Tq when
        causal; padded keys get 0. weights · V is `forward`'s output.
        """
        qf, kf = _features(q, k, pad)
        scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf)  # (B, H, Tq, Tk)
        if causal:
            scores = scores * causal_mask(q.size(1), k.size(1), q.device)
        return (scores / (scores.sum(dim=-1, keepdim=True) + self.eps)).to(q.dtype)

    def new_cache(self, capacity: int | None = None) -> DecodeCache:
        """A `LinearState` of running sums (`capacity` is not needed)."""
        return LinearState(self)

    def _causal(
        self, qf: Tensor, kf: Tensor, vf: Tensor, s0: Tensor, z0: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Chunked causal sums for aligned φ(q), φ(k), v (B, T, H, D); (B,T,H,E), (B,T,H)."""
        b, t, h, d = qf.shape
        e = vf.size(-1)
        c = min(self.chunk_size, t)
        n = -(-t // c)
        pad = (0, 0, 0, 0, 0, n * c - t)  # zero-pad dim 1 to N*C: zero keys add nothing
        qc = F.pad(qf, pad).view(b, n, c, h, d)  # (B, N, C, H, D)
        kc = F.pad(kf, pad).view(b, n, c, h, d)
        vc = F.pad(vf, pad).view(b, n, c, h, e)  # (B, N, C, H, E)

        # Within a chunk: the masked C x C product, like attention without softmax.
        tril = torch.ones(c, c, dtype=torch.bool, device=qf.device).tril()
        scores = torch.einsum("bnihd,bnjhd->bnhij", qc, kc) * tril  # (B, N, H, C, C)
        num = torch.einsum("bnhij,bnjhe->bnihe", scores, vc)  # (B, N, C, H, E)
        den = scores.sum(dim=-1).transpose(2, 3)  # (B, N, H, C) -> (B, N, C, H)

        # Across chunks: exclusive prefix sums of per-chunk states, plus the initial state.
        kv = torch.einsum("bnjhd,bnjhe->bnhde", kc, vc)  # (B, N, H, D, E)
        state = _exclusive_cumsum(kv) + s0[:, None]  # (B, N, H, D, E), keys of chunks < n
        zstate = _exclusive_cumsum(kc.sum(dim=2)) + z0[:, None]  # (B, N, H, D)
        num = num + torch.einsum("bnihd,bnhde->bnihe", qc, state)
        den = den + torch.einsum("bnihd,bnhd->bnih", qc, zstate)
        return num.reshape(b, n * c, h, e)[:, :t], den.reshape(b, n * c, h)[:, :t]

    def extra_repr(self) -> str:
        return f"name={self.name}, chunk_size={self.chunk_size}, eps={self.eps}"


def _features(q: Tensor, k: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor]:
    """φ(q) and φ(k) in fp32, each (B, T, H, D); keys marked in `pad` (B, Tk) get 0."""
    qf, kf = feature_map(q.float()), feature_map(k.float())
    kpm = safe_padding_mask(pad)
    if kpm is not None:
        kf = kf.masked_fill(kpm[:, :, None, None], 0.0)
    return qf, kf


class LinearState(DecodeCache):
    """Decode state of causal `linear` attention: S = Σ φ(k) vᵀ and z = Σ φ(k) so far.

    A step adds the new positions to the sums after attending with them (the causal
    formula of `LinearAttention._causal` with S, z as the initial state): O(1) time and
    memory per step in the decoded length.
    """

    def __init__(self, kernel: LinearAttention) -> None:
        self.kernel = kernel
        self.s: Tensor | None = None  # (B, H, D, E) fp32
        self.z: Tensor | None = None  # (B, H, D) fp32

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """See `DecodeCache.attend`."""
        qf, kf = _features(q, k, None)  # (B, Tq, H, D)
        vf = v.float()
        if self.s is None or self.z is None:
            b, _, h, d = kf.shape
            self.s = kf.new_zeros(b, h, d, vf.size(-1))
            self.z = kf.new_zeros(b, h, d)
        num, den = self.kernel._causal(qf, kf, vf, self.s, self.z)  # (B,Tq,H,E), (B,Tq,H)
        self.s = self.s + torch.einsum("bkhd,bkhe->bhde", kf, vf)
        self.z = self.z + kf.sum(dim=1)
        return (num / (den[..., None] + self.kernel.eps)).to(q.dtype)

    def reorder(self, index: Tensor) -> None:
        """See `DecodeCache.reorder`."""
        if self.s is not None and self.z is not None:
            self.s, self.z = self.s.index_select(0, index), self.z.index_select(0, index)


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """Sum over the chunks strictly before each chunk (dim 1): (B, N, ...) -> (B, N, ...)."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1].cumsum(dim=1)], dim=1)
