"""`release_process_group`: a rank leaves its process group, and only when it is in one."""

from __future__ import annotations

import logging

import pytest
import torch.distributed as dist

from litmt.runtime.distributed import release_process_group


def test_a_process_outside_any_group_has_nothing_to_release() -> None:
    assert not dist.is_initialized()
    assert release_process_group() is False


def test_a_gloo_rank_leaves_its_group(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert dist.is_initialized()
        with caplog.at_level(logging.INFO, logger="litmt.runtime.distributed"):
            assert release_process_group() is True
        assert not dist.is_initialized()
        assert "left the gloo process group" in caplog.text
        assert release_process_group() is False  # a second call is a no-op
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
