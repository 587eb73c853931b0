"""`auto`: the best exact backend the running device supports, chosen per device and dtype.

Shapes: B batch, Tq/Tk query/key length, H heads, D head dim.

Rule: ``flash`` on a CUDA GPU of sm80 or newer with fp16/bf16 inputs when flash-attn is
installed; ``sdpa`` everywhere else (CPU, older GPUs, fp32, no flash-attn). The choice is
made once per (device, dtype) and logged at INFO level; `validate` logs the choice for the
device the model is built for.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from litmt.attention.backends.flash import FlashAttention
from litmt.attention.backends.sdpa import SDPAAttention
from litmt.attention.base import AttentionKernel, AttentionRequest, BackendSupport

log = logging.getLogger(__name__)

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def choose_backend(device: str | torch.device | None, dtype: torch.dtype | None) -> str:
    """Name of the backend `auto` uses on `device` for inputs of `dtype` ("flash" or "sdpa")."""
    dev = torch.device(device if device is not None else "cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "sdpa"
    if torch.cuda.get_device_capability(dev) < (8, 0):
        return "sdpa"
    if dtype is not None and dtype not in _FLASH_DTYPES:
        return "sdpa"
    problem = FlashAttention.unavailable()  # imports flash_attn and looks up what it calls
    if problem is not None:
        if problem[0] == "not usable":
            log.warning("attention=auto: flash-attn is installed but not usable (%s); using sdpa",
                        problem[1])  # fmt: skip
        return "sdpa"
    return "flash"


class AutoAttention(AttentionKernel):
    """Delegates to `flash` or `sdpa` (see `choose_backend`); both are exact."""

    name = "auto"
    support = BackendSupport(notes="flash on CUDA sm80+ with fp16/bf16 and flash-attn, else sdpa")

    def __init__(self) -> None:
        super().__init__()
        # Plain dict, not child modules: kernels own no weights, the state dict stays empty.
        self._kernels: dict[tuple[str, int | None, torch.dtype | None], AttentionKernel] = {}

    def kernel_for(
        self, device: torch.device, dtype: torch.dtype | None, site: str = "attention"
    ) -> AttentionKernel:
        """The kernel used on `device` for `dtype` (built and logged on first use)."""
        key = (device.type, device.index, dtype)
        kernel = self._kernels.get(key)
        if kernel is None:
            name = choose_backend(device, dtype)
            if name == "flash":
                from litmt.attention.backends.flash import FlashAttention

                kernel = FlashAttention()
            else:
                kernel = SDPAAttention()
            what = str(dtype).replace("torch.", "") if dtype is not None else "any dtype"
            log.info("attention=auto at %s: using '%s' on %s (%s)", site, name, device, what)
            self._kernels[key] = kernel
        return kernel

    def validate(self, request: AttentionRequest) -> None:
        """Check the request against the chosen kernel (and log the choice)."""
        super().validate(request)
        device = torch.device(request.device if request.device is not None else "cpu")
        self.kernel_for(device, request.dtype, request.site).validate(request)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Attend `q` (B, Tq, H, D) over `k`, `v` (B, Tk, H, D); return (B, Tq, H, D)."""
        kernel = self.kernel_for(q.device, q.dtype)
        return kernel(
            q, k, v, key_padding_mask=key_padding_mask, causal=causal, dropout_p=dropout_p
        )
