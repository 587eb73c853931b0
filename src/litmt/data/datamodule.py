"""`TranslationDataModule`: corpus → sentencepiece → cached token ids → bucketed batches.

Its parts, each in its own module:
- the settings: `litmt.data.config.DataConfig` (every `conf/data` key, defined once);
- the corpus: `litmt.data.corpora.interface.Corpora`, one interface for one pair (`PairCorpora`) and
  for several directions (`litmt.data.corpora.multi.MultiCorpus`);
- the cache layout: `litmt.data.preparation.cache_layout.CacheLayout` (tokenizer, token ids, text);
- the tokenizer and the prepared splits: `litmt.data.preparation.prepared.PreparedData`;
- preparing once per node: `litmt.data.preparation.once`;
- here: Lightning's hooks and the loaders.

`prepare_data` (one process per node) trains or loads the tokenizer and tokenises every
split into the prepared cache; `setup` (every process) memory-maps those caches. Both are
safe to call alone: whatever is missing is built, whatever is cached is reused.

Batches: see `collate.collate` (keys `src`, `tgt_in`, `tgt_out`, masks, lengths, `index`,
`ntokens` as a python int). Train batches come from `TokenBudgetBatchSampler` (shuffled,
bucketed, deterministic per (seed, epoch), split across DDP ranks, resumable mid-epoch); with
subword sampling their items are encoded again every epoch (`SampledPairs`), on the same plan;
valid/test batches are length-sorted, never filtered, and also split across ranks with
equal batch counts (examples repeat only when a split has fewer examples than ranks, so
gather hypotheses by `index` and drop duplicates).

Under DDP set `trainer.use_distributed_sampler=false`: the sampler reads rank and world
size from `torch.distributed` when the dataloader is created.

`prepare_once` (called by `litmt.cli.train` before the Trainer exists, when launchers such as
torchrun or SLURM have started every rank at once) lets one process per node prepare
(`prepare_data_per_node=true`, Lightning's default) or one per job on a shared filesystem
(`false`), while the others wait for its marker file and then read the caches.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from litmt.data.batching.collate import TokenizedPairs
from litmt.data.batching.loader import ResumableDataLoader, token_budget_loader
from litmt.data.batching.sampler import dist_rank_world
from litmt.data.config import DataConfig
from litmt.data.corpora.parallel import SPLITS
from litmt.data.preparation.once import is_preparer, prepare_and_publish, wait_for_marker
from litmt.data.preparation.prepared import PreparedData
from litmt.errors import ConfigError, DataError
from litmt.runtime.lightning_compat import uses_distributed_sampler

log = logging.getLogger(__name__)

# the splits each Lightning stage needs
_STAGES = {
    "fit": ("train", "valid"),
    "validate": ("valid",),
    "test": ("test",),
    "predict": ("test",),
}


class TranslationDataModule(PreparedData, L.LightningDataModule):
    """Loads a parallel corpus, tokenises it and serves padded batches.

    Args:
        config: the settings; or, instead,
        settings: the keys of `conf/data/*.yaml` as Hydra passes them (`DataConfig`
            documents each; null = its default).

    Raises:
        ConfigError: an unknown or invalid setting.
    """

    def __init__(self, config: DataConfig | None = None, **settings: Any) -> None:
        L.LightningDataModule.__init__(self)
        if config is not None and settings:
            raise ConfigError("pass a DataConfig or data settings, not both")
        PreparedData.__init__(self, config or DataConfig.from_kwargs(settings))
        self.prepare_data_per_node = self.config.prepare_data_per_node  # Lightning's flag
        self.pad_to_multiple = int(self.config.pad_to_multiple)  # FP8 raises it (cli.train)
        self.datasets: dict[str, TokenizedPairs] = {}
        self._prepared_paths: list[str] = []  # what the last prepare_data published

    # -- prepare once per node (or per job), the other ranks wait (`litmt.data.preparation.once`) --
    def prepared_marker(self) -> Path:
        """The file the preparing process writes when the caches are complete (or it failed)."""
        return self.layout.prepared_marker(self.tokenizer_dir())

    def is_preparer(self) -> bool:
        """Whether this process prepares the data (`litmt.data.preparation.once.is_preparer`)."""
        return is_preparer(self.prepare_data_per_node)

    def prepare_once(self, poll_s: float = 0.5) -> None:
        """Prepare the data in one process per node (or per job); other processes wait.

        Works before any process group exists: the preparer writes a JSON marker under
        `cache_dir/prepared/` once every cache is published (or, on failure, a failed
        marker), and the others poll it (`litmt.data.preparation.once`).

        Raises:
            DataError: the preparing process failed, or did not finish in `prepare_timeout`.
        """
        marker = self.prepared_marker()
        if self.is_preparer():

            def prepare() -> list[str]:
                self.prepare_data()
                return self._prepared_paths  # what the waiting ranks check

            prepare_and_publish(prepare, marker)
            return
        wait_for_marker(
            marker,
            per_node=self.prepare_data_per_node,
            timeout=float(self.config.prepare_timeout),
            poll_s=poll_s,
        )

    # -- LightningDataModule ------------------------------------------------------------
    def prepare_data(self) -> None:
        """Train/load the tokenizer and tokenise every split into the cache (one process)."""
        t0 = time.perf_counter()
        tok = self._get_tokenizer()
        self._prepared_paths = [str(self.tokenizer_dir())]
        for split in SPLITS:
            try:
                self._prepared(split)
            except DataError as exc:
                if split != "test":
                    raise
                # training does not need a test split; `setup("test")` raises this again
                log.warning("test split unavailable (%s)", exc)
                continue
            self._prepared_paths.append(str(self._cache_path(split, tok)))
        if self.tokenizer_settings.sampling() is not None:  # what the train split re-encodes
            self._prepared_paths.append(str(self._train_text().path))
        self.timings["prepare_s"] = time.perf_counter() - t0

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and the splits `stage` needs (fit: train+valid)."""
        t0 = time.perf_counter()
        self._get_tokenizer()
        for split in _STAGES.get(stage or "", SPLITS):
            if split not in self.datasets:
                self.datasets[split] = self._pairs(split)
        self.timings["setup_s"] = time.perf_counter() - t0

    def _dataset(self, split: str) -> TokenizedPairs:
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; use one of {SPLITS}")
        if split not in self.datasets:
            self.setup({"train": "fit", "valid": "validate", "test": "test"}[split])
        return self.datasets[split]

    def _loader(self, split: str, train: bool) -> ResumableDataLoader:
        ds = self._dataset(split)
        self._check_distributed()
        cfg = self.config
        max_tokens, batch_size = cfg.batch_budget(train)
        loader = token_budget_loader(
            ds,
            max_tokens=max_tokens,
            batch_size=batch_size,
            shuffle=train and cfg.shuffle,
            bucket_pool=cfg.bucket_pool if train else None,
            seed=cfg.seed,
            pad_to_multiple=self.pad_to_multiple,
            num_workers=cfg.num_workers,
            pin_memory=torch.cuda.is_available()
            if cfg.pin_memory is None
            else bool(cfg.pin_memory),
            scratch_dir=self.layout.scratch,
        )
        if train and self.trainer is not None:
            loader.set_epoch(self.trainer.current_epoch)
            if getattr(ds, "redrawn_per_epoch", False):
                self._reload_every_epoch()
        return loader

    def _reload_every_epoch(self) -> None:
        """Make Lightning rebuild the train loader every epoch: temperature sampling draws
        new examples each epoch, so the batch count changes a little, and Lightning would
        otherwise cut every epoch at the first one's count (`len` is measured per loader)."""
        trainer = self.trainer
        if trainer is None or trainer.reload_dataloaders_every_n_epochs == 1:
            return
        log.info(
            "data.sampling_temperature=%g draws the training examples again every epoch: "
            "setting trainer.reload_dataloaders_every_n_epochs=1 (was %d), so that each "
            "epoch's batches are counted",
            self.config.sampling_temperature, trainer.reload_dataloaders_every_n_epochs,
        )  # fmt: skip
        trainer.reload_dataloaders_every_n_epochs = 1

    def _check_distributed(self) -> None:
        trainer = self.trainer
        if trainer is None or dist_rank_world()[1] == 1:
            return
        if uses_distributed_sampler(trainer):
            raise ConfigError(
                "TranslationDataModule splits batches across ranks itself; set "
                "trainer.use_distributed_sampler=false"
            )

    def train_dataloader(self) -> ResumableDataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> ResumableDataLoader:
        return self._loader("valid", train=False)

    def test_dataloader(self) -> ResumableDataLoader:
        return self._loader("test", train=False)


__all__ = ["TranslationDataModule"]
