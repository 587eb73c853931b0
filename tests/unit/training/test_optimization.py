"""What one optimiser step computes: token-normalised gradients across gradient accumulation
and DDP ranks, gradient clipping (its FSDP branch included) and the non-finite check.

Each gradient is compared with a reference written here from the definition: the gradient of
(sum of the label-smoothed token losses) / (number of non-pad target tokens) over every
micro-batch of the step, in float64, on a plain copy of the model.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_model import tiny_config
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset
from train_utils import free_port, lr_schedule, start_method

from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID
from litmt.errors import LitmtError
from litmt.training.grad import clip_gradients
from litmt.training.losses import label_smoothed_nll
from litmt.training.module import TranslationModule

VOCAB = 24
SMOOTHING = 0.1
Batch = dict[str, Any]


def tiny_module() -> TranslationModule:
    """A 1+1-layer model without dropout (the gradient is deterministic), SGD."""
    torch.manual_seed(0)
    config = tiny_config(
        src_vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1
    )
    module = TranslationModule(
        config,
        tokenizer=None,  # type: ignore[arg-type]  # not needed: no decoding, no checkpoint
        src_lang="en",
        tgt_lang="de",
        optimizer=functools.partial(torch.optim.SGD, lr=0.5),
        scheduler=lr_schedule(name="constant", warmup_steps=1),
        label_smoothing=SMOOTHING,
    )
    # float64 weights: the comparisons below are exact to ~1e-12. (The trainer runs
    # "32-true", which leaves the dtype alone: the attention backends declare fp32/fp16/bf16
    # only, so Lightning's "64-true" would be refused by `validate_backends`.)
    return module.double()


def make_batch(src_lengths: list[int], tgt_lengths: list[int], seed: int) -> Batch:
    """A right-padded batch like `litmt.data.batching.collate` builds: src (B, S), tgt_in/tgt_out
    (B, T), ntokens = non-pad target tokens."""
    g = torch.Generator().manual_seed(seed)
    bsz = len(src_lengths)
    src = torch.full((bsz, max(src_lengths)), PAD_ID)
    tgt_in = torch.full((bsz, max(tgt_lengths) + 1), PAD_ID)
    tgt_out = torch.full_like(tgt_in, PAD_ID)
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[i, :s] = torch.randint(4, VOCAB, (s,), generator=g)
        words = torch.randint(4, VOCAB, (t,), generator=g)
        tgt_in[i, : t + 1] = torch.cat([torch.tensor([BOS_ID]), words])
        tgt_out[i, : t + 1] = torch.cat([words, torch.tensor([EOS_ID])])
    ntokens = int(tgt_out.ne(PAD_ID).sum())
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "ntokens": ntokens,
            "index": torch.arange(bsz)}  # fmt: skip


def concat(batches: list[Batch]) -> Batch:
    """One batch holding every row of `batches` (re-padded to the longest row)."""

    def cat(key: str) -> Tensor:
        width = max(b[key].size(1) for b in batches)
        return torch.cat([torch.nn.functional.pad(b[key], (0, width - b[key].size(1)),
                                                  value=PAD_ID) for b in batches])  # fmt: skip

    out = {k: cat(k) for k in ("src", "tgt_in", "tgt_out")}
    out["ntokens"] = sum(b["ntokens"] for b in batches)
    out["index"] = torch.arange(out["src"].size(0))
    return out


def reference_grads(model: torch.nn.Module, batches: list[Batch]) -> dict[str, Tensor]:
    """d/dθ [Σ token losses / Σ non-pad target tokens] over all `batches`, by definition."""
    model = copy.deepcopy(model).double()
    model.zero_grad()
    total, tokens = torch.zeros((), dtype=torch.float64), 0
    for b in batches:
        logits = model(b["src"], b["tgt_in"])  # (B, T, V)
        loss_sum, _, ntok = label_smoothed_nll(
            logits.flatten(0, 1), b["tgt_out"].flatten(), SMOOTHING
        )
        total, tokens = total + loss_sum, tokens + int(ntok)
    (total / tokens).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class CaptureStep(L.Callback):
    """Keeps the weights at the start and the gradients at the end of the last optimiser step
    (Lightning zeroes the gradients only inside the next step)."""

    def __init__(self, out_dir: str | None = None) -> None:
        self.out_dir = out_dir
        self.weights: dict[str, Tensor] = {}
        self.grads: dict[str, Tensor] = {}
        self.grad_norm: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx % trainer.accumulate_grad_batches == 0:  # a new optimiser step begins
            self.weights = copy.deepcopy(pl_module.model.state_dict())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.grads = {
            n: p.grad.detach().clone()
            for n, p in pl_module.model.named_parameters()
            if p.grad is not None
        }
        norm = trainer.callback_metrics.get("train/grad_norm")
        self.grad_norm = None if norm is None else float(norm)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.out_dir is not None:  # DDP test: the workers write, the test reads
            torch.save(
                {"grads": self.grads, "weights": self.weights},
                Path(self.out_dir) / f"rank{trainer.global_rank}.pt",
            )


def fit(
    module: TranslationModule,
    data: Any,
    accumulate: int,
    steps: int,
    clip: float | None = None,
    **trainer_kwargs: Any,
) -> CaptureStep:
    """`steps` optimiser steps of Lightning on `data` (the float64 module stays float64)."""
    capture = trainer_kwargs.pop("capture", None) or CaptureStep()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="32-true",
        max_steps=steps,
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[capture],
        **{"devices": 1, **trainer_kwargs},
    )
    loader = data if isinstance(data, DataLoader) else DataLoader(data, batch_size=None)
    trainer.fit(module, train_dataloaders=loader)
    return capture


def assert_grads_equal(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert got.keys() == want.keys() and got
    # the gradients are large enough for a 1e-6 tolerance to tell normalisations apart
    assert max(float(g.abs().max()) for g in want.values()) > 1e-2
    for name, g in want.items():
        torch.testing.assert_close(got[name].double(), g, rtol=0, atol=1e-6, msg=name)


# -- token normalisation across gradient accumulation --------------------------------------

# micro-batches of N = 24 non-pad target tokens each (2 rows: 2 x (t + 1 for eos)), and an
# uneven split of the same 2N tokens, where a per-micro-batch mean would weigh tokens unequally
EVEN = ([7, 5], [11, 11], [9, 6], [10, 12])
UNEVEN = ([7, 5], [3, 4], [9, 6], [18, 19])


@pytest.mark.parametrize("split", [EVEN, UNEVEN], ids=["N+N", "uneven"])
def test_two_accumulated_micro_batches_equal_one_batch_of_both(split) -> None:
    a = make_batch(split[0], split[1], seed=1)
    b = make_batch(split[2], split[3], seed=2)
    assert a["ntokens"] + b["ntokens"] == 48
    module = tiny_module()
    want = reference_grads(module.model, [a, b])
    accumulated = fit(copy.deepcopy(module), [a, b], accumulate=2, steps=1)
    one_batch = fit(copy.deepcopy(module), [concat([a, b])], accumulate=1, steps=1)
    assert_grads_equal(accumulated.grads, want)
    assert_grads_equal(one_batch.grads, want)


def test_a_short_last_accumulation_step_is_normalised_by_its_own_tokens() -> None:
    """3 micro-batches, accumulate 2: the epoch's second step holds one micro-batch, which
    Lightning still divides by accumulate_grad_batches; the rescaling must undo exactly that."""
    batches = [make_batch([5, 3], [6, 2], seed=s) for s in (1, 2)] + [make_batch([4], [9], seed=3)]
    module = tiny_module()
    capture = fit(module, batches, accumulate=2, steps=2)
    start = copy.deepcopy(module.model)
    start.load_state_dict(capture.weights)  # the weights the second step started from
    assert_grads_equal(capture.grads, reference_grads(start, batches[2:]))


def test_train_loss_is_logged_per_token_and_the_step_returns_the_summed_loss() -> None:
    module = tiny_module()
    batch = make_batch([5, 7], [4, 9], seed=4)
    logits = module.model(batch["src"], batch["tgt_in"])
    loss_sum, _, ntok = label_smoothed_nll(
        logits.flatten(0, 1), batch["tgt_out"].flatten(), SMOOTHING
    )
    logged: dict[str, Tensor] = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)  # type: ignore[method-assign]
    out = module.training_step(batch, 0)
    torch.testing.assert_close(out["loss"], loss_sum)
    torch.testing.assert_close(logged["train/loss"], loss_sum.detach() / ntok)
    torch.testing.assert_close(out["token_loss"], loss_sum.detach() / ntok)


# -- the same gradient under 2-process gloo DDP ----------------------------------------------


class PerRankBatches(IterableDataset):
    """Rank r reads `per_rank[r]` (the rank is known only inside the worker process)."""

    def __init__(self, per_rank: list[list[Batch]]) -> None:
        self.per_rank = per_rank

    def __iter__(self):
        rank = dist.get_rank() if dist.is_initialized() else 0
        return iter(self.per_rank[rank])


def test_two_gloo_ranks_with_accumulation_give_the_one_process_gradient(tmp_path: Path) -> None:
    """DDP averages the ranks' gradients and Lightning divides by accumulate_grad_batches; the
    step must still be Σ token losses / Σ tokens over 2 ranks x 2 micro-batches."""
    batches = [
        make_batch([5, 3], [6, 2], seed=1),  # 10 target tokens
        make_batch([7], [3], seed=2),  # 4
        make_batch([4, 6, 2], [9, 8, 7], seed=3),  # 27
        make_batch([8, 8], [12, 15], seed=4),  # 29
    ]
    module = tiny_module()
    want = reference_grads(module.model, batches)
    one_process = fit(copy.deepcopy(module), batches, accumulate=4, steps=1)
    assert_grads_equal(one_process.grads, want)

    per_rank = [[batches[0], batches[2]], [batches[1], batches[3]]]
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        fit(
            copy.deepcopy(module),
            DataLoader(PerRankBatches(per_rank), batch_size=None),
            accumulate=2,
            steps=1,
            capture=CaptureStep(str(tmp_path)),
            devices=2,
            strategy=f"ddp_{start_method()}",  # gloo on CPU: Lightning starts the 2 ranks
            use_distributed_sampler=False,
        )
    finally:
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)["grads"]
        assert_grads_equal(got, want)


# -- gradient clipping and the non-finite check ----------------------------------------------


def test_clipping_bounds_the_norm_and_logs_the_norm_before_clipping() -> None:
    batch = make_batch([6, 4], [7, 5], seed=5)
    module = tiny_module()
    want = reference_grads(module.model, [batch])
    norm = math.sqrt(sum(float(g.square().sum()) for g in want.values()))
    max_norm = norm / 4
    capture = fit(module, [batch], accumulate=1, steps=1, clip=max_norm)
    clipped = math.sqrt(sum(float(g.square().sum()) for g in capture.grads.values()))
    assert clipped <= max_norm * (1 + 1e-6)
    assert capture.grad_norm == pytest.approx(norm, rel=1e-9)  # logged before clipping
    for name, g in want.items():  # clipping scales, it does not turn the gradient
        torch.testing.assert_close(capture.grads[name], g * (max_norm / norm), rtol=1e-5, atol=1e-9)


def test_clipping_by_value_and_no_clipping_still_return_the_norm() -> None:
    lin = torch.nn.Linear(3, 2)
    lin.weight.grad = torch.tensor([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0]])
    lin.bias.grad = torch.zeros(2)
    assert float(clip_gradients(lin, lin.parameters(), None)) == pytest.approx(5.0)
    assert lin.weight.grad.abs().max() == 4.0  # untouched
    assert float(clip_gradients(lin, lin.parameters(), 1.0, "value")) == pytest.approx(5.0)
    assert lin.weight.grad.abs().max() == 1.0  # each element clipped to [-1, 1]


def _fsdp_worker(rank: int, world: int, port: int, max_norm: float, out: str) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        plain = copy.deepcopy(model)
        inputs = [torch.randn(5, 6, generator=torch.Generator().manual_seed(r)) for r in range(2)]
        # Lightning's FSDPStrategy passes device_id=None on CPU, which torch refuses; torch's
        # FSDP itself runs on CPU with an explicit CPU device and gloo
        root = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
        root(inputs[rank]).square().sum().backward()  # FSDP averages the 2 ranks' gradients
        norm = clip_gradients(root, root.parameters(), max_norm, "norm")
        # the global norm after clipping, from each rank's shard of the flat gradient
        local = sum(float(p.grad.square().sum()) for p in root.parameters() if p.grad is not None)
        shard_norm = math.sqrt(local)
        total = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(total)
        # the reference: the mean of both ranks' losses, on the unsharded model
        sum(plain(x).square().sum() for x in inputs).div(2).backward()
        want = math.sqrt(sum(float(p.grad.square().sum()) for p in plain.parameters()))
        Path(out, f"{rank}.json").write_text(
            json.dumps(
                {
                    "norm": float(norm),
                    "after": math.sqrt(float(total)),
                    "want": want,
                    "shard": shard_norm,
                }
            )
        )
    finally:
        dist.destroy_process_group()


def test_fsdp_clipping_uses_the_norm_over_every_shard(tmp_path: Path) -> None:
    """The FSDP branch of `clip_gradients` on CPU (2 gloo ranks). Lightning cannot run FSDP on
    a CPU (`_AcceleratorConnector._check_strategy_and_fallback` requires CUDA), so the branch
    is called directly on torch's `FullyShardedDataParallel` root."""
    port = free_port()
    max_norm = 0.05
    mp.start_processes(
        _fsdp_worker,
        args=(2, port, max_norm, str(tmp_path)),
        nprocs=2,
        join=True,
        start_method=start_method(),
    )
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for g in got:
        assert g["norm"] == pytest.approx(g["want"], rel=1e-5)  # global, not this shard's
        assert g["want"] > 10 * max_norm  # clipping had work to do
        assert g["after"] <= max_norm * (1 + 1e-5)
    assert got[0]["shard"] != pytest.approx(got[0]["want"], rel=1e-3)  # shards differ


def test_non_finite_norm_raises_before_the_step_except_under_fp16_scaling() -> None:
    module = tiny_module()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    module.trainer = trainer
    module.check_finite(torch.tensor(3.0), torch.tensor(1.0))  # finite: nothing happens
    with pytest.raises(LitmtError, match=r"^the training loss became nan at step 0; stopped"):
        module.check_finite(torch.tensor(math.nan), torch.tensor(math.nan))
    with pytest.raises(LitmtError, match=r"^the gradients became non-finite \(norm inf\)"):
        module.check_finite(torch.tensor(math.inf), torch.tensor(1.0))
    from lightning.pytorch.plugins.precision import MixedPrecision

    # "16-mixed" with its GradScaler (on a CPU, Lightning would turn "16-mixed" into bf16)
    scaler = torch.amp.GradScaler("cpu")
    plugin = MixedPrecision("16-mixed", "cpu", scaler)
    module.trainer = L.Trainer(accelerator="cpu", plugins=[plugin], logger=False)
    module.check_finite(torch.tensor(math.inf), torch.tensor(1.0))  # the scaler skips the step
    with pytest.raises(LitmtError, match=r"^the training loss became inf"):
        module.check_finite(torch.tensor(math.inf), torch.tensor(math.inf))
