"""Numeric precision: Lightning precision strings → compute dtypes, the `auto` default, and the
precision of inference on a loaded checkpoint. FP8 (Transformer Engine) lives in
`litmt.runtime.fp8`.

Lightning is imported lazily (inside functions), so decoding does not pull it in.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from litmt.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

# Lightning's precision inputs (lightning/fabric/plugins/precision/precision.py,
# `_PRECISION_INPUT_STR` and `_PRECISION_INPUT_STR_ALIAS_CONVERSION`) → the dtype the model
# computes in. The Transformer Engine plugin is built by Lightning's accelerator connector
# (`_AcceleratorConnector._check_and_init_precision`) with `weights_dtype=torch.bfloat16`
# ("transformer-engine") or `torch.float16` ("transformer-engine-float16"); litmt builds it
# itself with float32 weights and that dtype as `fallback_compute_dtype`
# (`fp8_precision_plugin`). Its `forward_context` runs an autocast to the compute dtype
# around `te.fp8_autocast`, so everything that is not an FP8 GEMM (attention included)
# computes in bf16 / fp16.
_COMPUTE_DTYPES: dict[str, torch.dtype] = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "16-mixed": torch.float16,
    "bf16-mixed": torch.bfloat16,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "transformer-engine": torch.bfloat16,
    "transformer-engine-float16": torch.float16,
}
_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
AUTO = "auto"


def normalize_precision(precision: str | int | None) -> str:
    """Lightning's canonical precision string for `precision` (aliases like 16, "bf16" expanded)."""
    if precision is None:
        return "32-true"
    name = str(precision)
    return _ALIASES.get(name, name)


def is_fp8(precision: str | int | None) -> bool:
    """True for the Transformer Engine (FP8) precisions."""
    return normalize_precision(precision).startswith("transformer-engine")


def compute_dtype(precision: Any) -> torch.dtype:
    """The dtype the model's activations (and attention kernels) compute in.

    Args:
        precision: a Lightning precision input ("32-true", "16-mixed", "bf16-mixed",
            "16-true", "bf16-true", "64-true", "transformer-engine",
            "transformer-engine-float16", the aliases 16/32/64/"bf16", None = fp32), or a
            Lightning precision plugin (a trainer's `precision_plugin`).

    Raises:
        ConfigError: an unknown precision.
    """
    # The TE plugin's `precision` attribute is the class-level "transformer-engine" even for
    # the float16 variant; its `fallback_compute_dtype` (= weights_dtype unless set) is the
    # autocast dtype of `forward_context` (lightning/fabric/plugins/precision/transformer_engine.py).
    fallback = getattr(precision, "fallback_compute_dtype", None)
    if isinstance(fallback, torch.dtype):
        return fallback
    if hasattr(precision, "precision") and not isinstance(precision, str | int):
        precision = precision.precision
    name = normalize_precision(precision)
    if name not in _COMPUTE_DTYPES:
        raise ConfigError(
            f"unknown precision {precision!r}; use one of {', '.join(_COMPUTE_DTYPES)} or auto"
        )
    return _COMPUTE_DTYPES[name]


def precision_name(precision: Any) -> str:
    """The canonical precision string of a precision input or plugin, telling the two
    Transformer Engine variants apart (recorded in checkpoints as the training precision)."""
    if isinstance(getattr(precision, "fallback_compute_dtype", None), torch.dtype):
        fp16 = precision.fallback_compute_dtype == torch.float16
        return "transformer-engine-float16" if fp16 else "transformer-engine"
    if hasattr(precision, "precision") and not isinstance(precision, str | int):
        precision = precision.precision
    return normalize_precision(precision)


def resolve_precision(
    precision: str | int | None,
    accelerator: str | None = "auto",
    *,
    cuda_available: bool | None = None,
    bf16_supported: bool | None = None,
) -> str | int:
    """Turn `precision=auto` into a concrete Lightning precision; other values pass through.

    auto: bf16-mixed on a CUDA GPU that supports bf16 (Ampere and newer), 16-mixed (fp16
    autocast with loss scaling) on older GPUs, 32-true on the CPU or any other accelerator.

    Args:
        precision: the configured `trainer.precision`.
        accelerator: the configured `trainer.accelerator` (auto | cpu | gpu | cuda | ...).
        cuda_available, bf16_supported: the device's capabilities (None = ask torch).
    """
    if str(precision) != AUTO:
        return precision if precision is not None else "32-true"
    accel = str(accelerator or "auto")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if accel not in ("auto", "gpu", "cuda") or not cuda_available:
        return "32-true"
    if bf16_supported is None:
        bf16_supported = native_bf16()
    return "bf16-mixed" if bf16_supported else "16-mixed"


def native_bf16() -> bool:
    """Whether the current CUDA GPU computes bf16 natively (sm80+, or ROCm).

    `torch.cuda.is_bf16_supported()` also says True for GPUs that only emulate bf16 (its
    default `including_emulation=True`, torch/cuda/__init__.py), e.g. a V100, where bf16
    autocast is slow; older torch versions lack the argument, hence the capability check.
    """
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability()[0] >= 8


def runs_on_cuda(accelerator: str | None, cuda_available: bool | None = None) -> bool:
    """Whether a trainer with this `accelerator` runs on CUDA (Lightning's auto picks CUDA first)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return cuda_available and str(accelerator or "auto") in ("auto", "gpu", "cuda")


def configure_precision(precision: str | int | None, accelerator: str | None = "auto") -> str | int:
    """Resolve `trainer.precision` (see `resolve_precision`), log the choice in one line and,
    on CUDA, allow TF32 for the float32 matmuls that remain (`set_float32_matmul_precision`)."""
    resolved = resolve_precision(precision, accelerator)
    cuda = runs_on_cuda(accelerator)
    how = "auto" if str(precision) == AUTO else "configured"
    if cuda and torch.get_float32_matmul_precision() == "highest":
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for fp32 matmuls
    where = f"CUDA {torch.cuda.get_device_name()}" if cuda else str(accelerator or "auto")
    log.info(
        "precision: %s (%s, on %s; float32 matmul precision %s)",
        resolved, how, where, torch.get_float32_matmul_precision(),
    )  # fmt: skip
    return resolved


# -- FP8 (Transformer Engine) -------------------------------------------------------------
# -- inference on a loaded checkpoint -------------------------------------------------------
@dataclass(frozen=True)
class InferencePlan:
    """How to run a checkpoint on a device.

    Attributes:
        autocast: run the decoder under `torch.autocast(device, autocast)`; None = fp32.
        attention: replace every site's kernel by this exact backend; None = keep.
        message: the one log line explaining a change (None when nothing changes).
    """

    autocast: torch.dtype | None = None
    attention: str | None = None
    message: str | None = None


def inference_plan(
    device: torch.device,
    supports: Callable[[torch.dtype], bool],
    trained_precision: str | None,
    *,
    bf16_supported: bool | None = None,
    fallback: str = "sdpa",
) -> InferencePlan:
    """Decide how to decode a checkpoint whose kernels may not serve float32.

    Args:
        device: where decoding runs.
        supports: whether every attention kernel of the model serves `dtype` on `device`.
        trained_precision: the checkpoint's `trainer.precision` (None: not recorded).
        bf16_supported: the GPU supports bf16 (None = ask torch).
        fallback: the exact backend used when no dtype fits.

    Returns:
        fp32 when the kernels serve it; else, on CUDA, an autocast to the training compute
        dtype (or bf16, else fp16, when the checkpoint does not say) if the kernels serve it;
        else the `fallback` kernel in fp32.
    """
    if supports(torch.float32):
        return InferencePlan()
    candidates: list[torch.dtype] = []
    if device.type == "cuda":
        trained = None
        if trained_precision is not None:
            with contextlib.suppress(ConfigError):
                trained = compute_dtype(trained_precision)
        if trained in (torch.bfloat16, torch.float16):
            candidates.append(trained)
        if bf16_supported is None:
            bf16_supported = native_bf16()
        candidates += [torch.bfloat16] if bf16_supported else []
        candidates.append(torch.float16)
    for dtype in candidates:
        if supports(dtype):
            name = str(dtype).replace("torch.", "")
            return InferencePlan(
                autocast=dtype,
                message=f"inference in {name} autocast on {device} (the checkpoint's attention "
                f"kernels do not run in float32; trained with precision={trained_precision})",
            )
    return InferencePlan(
        attention=fallback,
        message=f"inference with attention={fallback} in float32 on {device} (the checkpoint's "
        f"attention kernels cannot run here)",
    )


def plan_model_inference(
    model: Any, device: torch.device, trained_precision: str | None
) -> InferencePlan:
    """`inference_plan` for a `Seq2SeqTransformer`: its kernels are asked through
    `validate_backends(device, dtype, training=False)` (which raises `BackendError`)."""

    def supports(dtype: torch.dtype) -> bool:
        try:
            model.validate_backends(device, dtype, training=False)
        except BackendError:
            return False
        return True

    return inference_plan(device, supports, trained_precision)


def autocast_context(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[Any]:
    """`torch.autocast(device.type, dtype)`, or a no-op for None (float32 inference)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
