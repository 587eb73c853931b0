"""`litmt.runtime.threads`: what ``threads=N`` gives each library."""

from __future__ import annotations

import pytest
import torch

from litmt.errors import ConfigError
from litmt.runtime.threads import ct2_thread_options


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_on_the_cpu_are_parallel_ct2_workers_of_one_thread():
    assert ct2_thread_options("cpu", 3) == {"inter_threads": 3, "intra_threads": 1}


def test_threads_zero_on_the_cpu_follows_torch_not_ct2s_fixed_four(torch_threads):
    """CTranslate2's own default is intra_threads=4 on any machine (its documentation, parallel.md), which
    oversubscribes a 2-core machine; threads=0 takes torch's count instead."""
    torch.set_num_threads(1)
    assert ct2_thread_options("cpu", 0) == {"inter_threads": 1, "intra_threads": 1}
    torch.set_num_threads(2)
    assert ct2_thread_options("cpu", 0) == {"inter_threads": 2, "intra_threads": 1}


def test_threads_on_a_gpu_are_intra_threads_and_zero_keeps_ct2s_default():
    assert ct2_thread_options("cuda", 2) == {"intra_threads": 2}
    assert ct2_thread_options("cuda", 0) == {}


def test_negative_threads_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^threads must be >= 0 \(0 = the default\), got -1$"):
        ct2_thread_options("cpu", -1)
