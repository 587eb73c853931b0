"""`StopAtTimeBudget`: a run with ``trainer.max_time`` stops right after the validation during
which its time budget ran out.

Lightning's `Timer` checks the budget only after a training batch. A validation that ends past
the budget (an epoch's last one, minutes long on a CPU) is then followed by one more optimizer
step, the `Timer`'s stop, and Lightning's validation at the stop: a second validation one step
later, with the weights barely changed (the time-based cosine LR is ~0 there), whose checkpoint
`ModelCheckpoint` keeps next to the first, so that the end step would average the two
(``best-step006175`` and ``best-step006176``). Stopping at the validation's end keeps one.
"""

from __future__ import annotations

import logging

import lightning as L

from litmt.training.schedules import time_budget_progress

log = logging.getLogger(__name__)


class StopAtTimeBudget(L.Callback):
    """Set ``trainer.should_stop`` at the end of a validation when ``trainer.max_time`` is spent.

    Every rank decides on rank 0's clock (`time_budget_progress` broadcasts it), so all stop
    together. Without ``trainer.max_time`` it does nothing.
    """

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.should_stop:
            return
        found = time_budget_progress(trainer)
        if found is None:
            return
        progress, budget = found
        if progress() >= 1.0:
            log.info(
                "trainer.max_time (%.0f s) ran out during this validation: stopping at step %d "
                "(no extra step and no second validation of near-identical weights)",
                budget,
                trainer.global_step,
            )
            trainer.should_stop = True
