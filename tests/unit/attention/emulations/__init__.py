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

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from litmt.attention import base
from litmt.attention.base import ALL_DTYPES, AttentionKernel

# CUDA's "current device": what ``torch.zeros(..., device="cuda")`` and a library's
# default-device tensors land on. A process starts on device 0; only
# ``torch.cuda.device(d)`` / ``torch.cuda.set_device(d)`` change it. On CPU the tensors'
# device is "cpu", so an unset current device is the placeholder cuda:0 below, which is
# never the tensors' device: a library allocation made without setting the device then
# fails as it would on ``cuda:1`` with device 0 current.
PROCESS_DEFAULT_DEVICE = torch.device("cuda", 0)
CURRENT_DEVICE: dict[str, torch.device] = {"device": PROCESS_DEFAULT_DEVICE}


def current_device() -> torch.device:
    """The emulated current CUDA device (``torch.cuda.current_device()``)."""
    return CURRENT_DEVICE["device"]


def check_same_device(*tensors_or_devices: torch.Tensor | torch.device) -> None:
    """``torch.cat``'s rule: "Expected all tensors to be on the same device"."""
    devices = {
        str(t.device if isinstance(t, torch.Tensor) else torch.device(t))
        for t in tensors_or_devices
    }
    if len(devices) > 1:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            + " and ".join(sorted(devices))
        )


@contextlib.contextmanager
def _emulated_device_context(device: torch.device) -> Iterator[None]:
    """``torch.cuda.device(device)``: `device` is current inside, the old one after."""
    old = CURRENT_DEVICE["device"]
    CURRENT_DEVICE["device"] = torch.device(device)
    try:
        yield
    finally:
        CURRENT_DEVICE["device"] = old


def emulate_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start the emulated process on cuda:0 and let litmt's device helper set the device.

    litmt enters `litmt.attention.base.device_context(q.device)` around library calls; on a
    CUDA tensor that is ``torch.cuda.device(q.device)``. Here it makes q's (CPU) device the
    emulated current device, so a call made outside it sees cuda:0.
    """
    monkeypatch.setitem(CURRENT_DEVICE, "device", PROCESS_DEFAULT_DEVICE)
    monkeypatch.setattr(base, "device_context", _emulated_device_context, raising=False)


def allow_cpu_fp32(monkeypatch: pytest.MonkeyPatch, kernel_cls: type[AttentionKernel]) -> None:
    """Test-only: let `kernel_cls` take CPU fp32 tensors (its real `check_inputs` still runs)."""
    support = replace(
        kernel_cls.support,
        devices=(*kernel_cls.support.devices, "cpu"),
        dtypes=ALL_DTYPES,
        min_cuda_capability=None,
    )
    monkeypatch.setattr(kernel_cls, "support", support)
