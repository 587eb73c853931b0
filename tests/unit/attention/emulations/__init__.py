"""CPU emulations of the optional attention libraries, written from their sources.

Each module implements one library's *rules* (argument checks, how masks become sequence
lengths, causal alignment, padding conventions), citing the file and function it follows,
and computes the attention itself in plain fp32/fp64 PyTorch. `install` puts it into
``sys.modules`` under the library's import names, so litmt's real backend code runs its
real call path on CPU.

The libraries only run CUDA fp16/bf16 kernels. The emulations check device and dtype like
the library does unless installed with ``allow_cpu_fp32=True``, and the backend's own
check is relaxed with `allow_cpu_fp32` below: both are explicit, test-only overrides.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from litmt.attention.base import ALL_DTYPES, AttentionKernel


def allow_cpu_fp32(monkeypatch: pytest.MonkeyPatch, kernel_cls: type[AttentionKernel]) -> None:
    """Test-only: let `kernel_cls` take CPU fp32 tensors (its real `check_inputs` still runs)."""
    support = replace(
        kernel_cls.support,
        devices=(*kernel_cls.support.devices, "cpu"),
        dtypes=ALL_DTYPES,
        min_cuda_capability=None,
    )
    monkeypatch.setattr(kernel_cls, "support", support)
