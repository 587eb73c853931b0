"""Training losses.

Loss normalisation (fairseq's and Sockeye's choice): the gradient of one optimiser step is

    sum of the label-smoothed token losses / number of non-pad target tokens

over *all* the micro-batches (`trainer.accumulate_grad_batches`) and ranks of that step, so the
update does not depend on how a token budget was split into batches, accumulation steps or
processes. `training_step` returns its micro-batch's summed loss; Lightning divides it by
`accumulate_grad_batches` (`ClosureResult.from_training_step_output` in
lightning/pytorch/loops/optimization/automatic.py) and DDP and FSDP average the gradients over
the `world_size` ranks. `on_before_optimizer_step` undoes both: it multiplies the gradients by
`accumulate_grad_batches * world_size / step_tokens`, where `step_tokens` (the step's non-pad
target tokens) is all-reduced once per optimiser step, not per micro-batch. The logged
`train/loss` stays per token (of each micro-batch). Under fp16 loss scaling ("16-mixed") the
summed loss makes the first steps overflow until the scaler has lowered its scale by about the
token count (some log2(tokens per step) skipped steps, as with fairseq's summed losses); the
scaled gradients are then the same as with a mean loss. bf16 and fp32 are unaffected.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from litmt.data.tokenization.tokenizer import PAD_ID


def label_smoothed_nll(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int = PAD_ID
) -> tuple[Tensor, Tensor, Tensor]:
    """Label-smoothed cross-entropy from one log-softmax (fairseq's formulation).

    Args:
        logits: (N, V) unnormalised scores.
        target: (N,) gold ids; `ignore_index` positions contribute nothing.
        epsilon: smoothing mass spread uniformly over the vocabulary.

    Returns:
        (loss_sum, nll_sum, ntokens): summed smoothed loss, summed NLL, and the number of
        non-ignored targets (all 0-d tensors).
    """
    # at least fp32 (bf16/fp16 logits are upcast; fp64 stays fp64)
    lprobs = F.log_softmax(
        logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1
    )  # (N, V)
    keep = target.ne(ignore_index)  # (N,)
    nll = -lprobs.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (N,)
    nll_sum = nll.masked_fill(~keep, 0.0).sum()
    if epsilon > 0:
        smooth = -lprobs.sum(-1).masked_fill(~keep, 0.0).sum()  # Σ over V of -log p
        loss_sum = (1.0 - epsilon) * nll_sum + epsilon / lprobs.size(-1) * smooth
    else:
        loss_sum = nll_sum
    return loss_sum, nll_sum, keep.sum()
