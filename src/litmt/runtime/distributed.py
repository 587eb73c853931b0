"""Leaving a torch.distributed process group cleanly at the end of a run.

Lightning registers `torch.distributed.destroy_process_group` at exit for NCCL only
(lightning/fabric/utilities/distributed.py, `_init_dist_connection`: "if
torch_distributed_backend == 'nccl': atexit.register(_destroy_dist_connection)"). A gloo
rank (DDP on CPU) therefore exits with its group alive, and gloo's worker threads can then
abort the interpreter's shutdown with "terminate called without an active exception"
(SIGABRT; pytorch/pytorch#190489) after a run that finished: one rank of litmt's two-rank
gloo test died that way in 1 of 4 CI runs on 2026-12-02.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def release_process_group() -> bool:
    """Destroy the default process group if this process is in one; returns whether it was.

    Call it once every collective of the run is done (after `fit`, `test` and the end step):
    destroying is local to this rank, so a rank that finishes first does not wait for the
    others, and a later collective in this process would fail.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    backend = dist.get_backend()
    dist.destroy_process_group()
    log.info("left the %s process group", backend)
    return True
