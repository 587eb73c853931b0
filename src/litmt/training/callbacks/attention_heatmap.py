"""AttentionHeatmap: log a cross-attention heatmap of a fixed sentence at every validation."""

from __future__ import annotations

import logging

import lightning as L

from litmt.errors import LitmtError

log = logging.getLogger(__name__)


class AttentionHeatmap(L.Callback):
    """After each validation, logs the cross-attention heatmap of one fixed validation
    sentence to W&B (`valid/cross_attention`); does nothing without a `WandbLogger`.

    Args:
        sentence: the index of the validation source sentence to draw.
    """

    def __init__(self, sentence: int = 0) -> None:
        self.sentence = int(sentence)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        from lightning.pytorch.loggers import WandbLogger
        from torch.distributed.fsdp import FullyShardedDataParallel

        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        dm = trainer.datamodule
        if not wandb_loggers or dm is None or not hasattr(dm, "sources"):
            return
        if isinstance(trainer.model, FullyShardedDataParallel):
            # rank 0 alone cannot run the model: FSDP shards the weights over every rank
            log.info("no attention heatmap under FSDP (the weights are sharded)")
            return
        sources = dm.sources("valid")
        if self.sentence >= len(sources):
            return
        import matplotlib.pyplot as plt

        from litmt.decoding.analysis.attention_maps import cross_attention_figure

        try:
            # outside the step hooks Lightning runs no autocast: enter the precision plugin's
            # own (Precision.forward_context, lightning/pytorch/plugins/precision/precision.py)
            # so that a half-only kernel (flash, te) gets its dtype
            with trainer.precision_plugin.forward_context():
                fig = cross_attention_figure(
                    pl_module.model, pl_module.tokenizer, sources[self.sentence]
                )
        except LitmtError as exc:  # e.g. an attention backend that cannot return weights
            log.warning("skipping the attention heatmap: %s", exc)
            return
        wandb_loggers[0].log_image("valid/cross_attention", images=[fig], step=trainer.global_step)
        plt.close(fig)
