"""Numeric precision: Lightning precision strings → compute dtypes, the `auto` default, FP8
(Transformer Engine) helpers, and the precision of inference on a loaded checkpoint.

Lightning is imported lazily (inside functions), so decoding does not pull it in.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

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

# Transformer Engine's FP8 GEMM rule (transformer_engine/pytorch/utils.py,
# `assert_dim_for_fp8_exec`): the product of all dimensions but the last must be divisible by
# 8, and the last dimension by 16. litmt pads batch lengths so that B*S and B*T rows meet it.
FP8_ROW_MULTIPLE = 8
FP8_FEATURE_MULTIPLE = 16


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
def pad_multiple_for(precision: str | int | None, configured: int | None = 1) -> int:
    """The multiple batch lengths must be padded to under `precision`.

    Transformer Engine's FP8 GEMMs need the rows B*S / B*T of every projection divisible by 8
    (transformer_engine/pytorch/utils.py `assert_dim_for_fp8_exec`; see
    `litmt.data.collate.collate`). A `configured` multiple (`data.pad_to_multiple`; None or 1 =
    no constraint) is kept when it already is a multiple of 8, else raised to the least common
    multiple. Other precisions keep `configured`.
    """
    current = int(configured or 1)
    return math.lcm(current, FP8_ROW_MULTIPLE) if is_fp8(precision) else current


def tied_linears(module: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Every `nn.Linear` (as parent, attribute name, layer) whose weight another module shares,
    e.g. an output projection tied to the target embedding."""
    counts: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    found = []
    for parent in module.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and counts.get(id(child.weight), 0) > 1:
                found.append((parent, name, child))
    return found


@contextlib.contextmanager
def hide_tied_linears(module: nn.Module) -> Iterator[list[str]]:
    """Swap every tied `nn.Linear` for a placeholder while the block runs, then put it back.

    Lightning's FP8 conversion (`_convert_layers` in
    lightning/fabric/plugins/precision/transformer_engine.py) replaces each eligible
    `nn.Linear` child by a `te.Linear` holding `child.weight.data.clone()`: a tied output
    projection would silently get its own copy of the embedding. Hidden layers stay torch
    Linears (computing in the plugin's bf16/fp16 autocast) and keep sharing their weight.

    Yields:
        the qualified names of the hidden layers.
    """
    found = tied_linears(module)
    names = {id(layer): n for n, layer in module.named_modules()}
    for parent, name, _ in found:
        setattr(parent, name, nn.Identity())
    try:
        yield [names[id(layer)] for _, _, layer in found]
    finally:
        for parent, name, layer in found:
            setattr(parent, name, layer)


def check_fp8_linears(module: nn.Module) -> None:
    """Refuse, in one line, a Linear that Lightning would convert but TE cannot run in FP8.

    Lightning converts an `nn.Linear` when in_features % 8 == 0 and out_features % 16 == 0
    (`_convert_layers`), but TE's FP8 GEMM asserts that the input's last dimension, i.e.
    in_features, is divisible by 16 (`assert_dim_for_fp8_exec`): such a layer would fail on
    the first batch, deep inside TE.

    Raises:
        ConfigError: naming the layer and its size.
    """
    tied = {id(layer) for _, _, layer in tied_linears(module)}
    for name, layer in module.named_modules():
        if not isinstance(layer, nn.Linear) or id(layer) in tied:
            continue
        converted = layer.in_features % 8 == 0 and layer.out_features % 16 == 0
        if converted and layer.in_features % FP8_FEATURE_MULTIPLE:
            raise ConfigError(
                f"FP8: layer {name} has in_features={layer.in_features}, which Transformer "
                f"Engine's FP8 GEMMs need divisible by {FP8_FEATURE_MULTIPLE}; use model sizes "
                f"(d_model, d_ff) divisible by {FP8_FEATURE_MULTIPLE}"
            )


@contextlib.contextmanager
def fp8_disabled() -> Iterator[None]:
    """Run the block without FP8 GEMMs (in the surrounding bf16/fp16 autocast).

    Used around incremental decoding during FP8 training: a decode step has B×1 (or B·k×1)
    rows, which `assert_dim_for_fp8_exec` rejects unless B is a multiple of 8. A no-op when
    Transformer Engine has not been imported (then FP8 cannot be active).
    """
    te = sys.modules.get("transformer_engine.pytorch")
    if te is None:
        yield
        return
    with te.fp8_autocast(enabled=False):
        yield


_FP8_PLUGIN: type | None = None


def fp8_precision_plugin(precision: str) -> Any:
    """Lightning's Transformer Engine plugin for `precision`, with float32 master weights and
    tied weights kept tied.

    Lightning's accelerator connector builds the plugin with ``weights_dtype`` bf16
    ("transformer-engine") or fp16 ("-float16") (`_check_and_init_precision`), and
    `convert_module` casts the whole module to it: the optimizer then updates bf16 weights
    with no float32 copy, and an update below the weight's bf16 spacing (2^-8 relative) is
    lost. Here the weights stay float32 (the optimizer's master copy; TE casts them to FP8 at
    each GEMM) and ``fallback_compute_dtype`` keeps the compute in bf16 / fp16: the plugin's
    `forward_context` autocasts to it around `te.fp8_autocast`. `convert_module` converts
    every untied `nn.Linear` / `nn.LayerNorm` exactly as Lightning does (`hide_tied_linears`).
    """
    global _FP8_PLUGIN
    if _FP8_PLUGIN is None:
        from lightning.pytorch.plugins.precision.transformer_engine import (
            TransformerEnginePrecision,
        )

        class TiedTransformerEnginePrecision(TransformerEnginePrecision):
            """`TransformerEnginePrecision` that leaves tied `nn.Linear` layers unconverted."""

            def convert_module(self, module: nn.Module) -> nn.Module:
                check_fp8_linears(module)
                with hide_tied_linears(module) as hidden:
                    module = super().convert_module(module)
                if hidden:
                    log.info(
                        "FP8: %s stay(s) torch Linear in %s (weight tied), the rest use te.Linear",
                        ", ".join(hidden), str(self.weights_dtype).replace("torch.", ""),
                    )  # fmt: skip
                return module.to(dtype=self.weights_dtype)

        _FP8_PLUGIN = TiedTransformerEnginePrecision
    name = normalize_precision(precision)
    compute = {"transformer-engine": torch.bfloat16, "transformer-engine-float16": torch.float16}
    if name not in compute:
        raise ConfigError(f"{precision!r} is not an FP8 precision; use transformer-engine")
    return _FP8_PLUGIN(weights_dtype=torch.float32, fallback_compute_dtype=compute[name])


EXTRA_STATE_SUFFIX = "._extra_state"


def drop_fp8_extra_state(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A state dict without Transformer Engine's `*._extra_state` entries (FP8 scaling
    metadata, saved by TE modules' `get_extra_state`), which a plain torch model does not have
    and a strict `load_state_dict` would reject. The weights themselves keep their names."""
    return {k: v for k, v in state_dict.items() if not k.endswith(EXTRA_STATE_SUFFIX)}


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
