"""FP8 (Transformer Engine) training helpers: the GEMM shape rules, batch padding, tied weights
kept tied through Lightning's conversion, FP8 off for decode steps, and TE's extra state.

Lightning and Transformer Engine are imported lazily (inside functions).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from litmt.errors import ConfigError
from litmt.runtime.precision import is_fp8, normalize_precision

log = logging.getLogger(__name__)

# Transformer Engine's FP8 GEMM rule (transformer_engine/pytorch/utils.py,
# `assert_dim_for_fp8_exec`): the product of all dimensions but the last must be divisible by
# 8, and the last dimension by 16. litmt pads batch lengths so that B*S and B*T rows meet it.
FP8_ROW_MULTIPLE = 8
FP8_FEATURE_MULTIPLE = 16


def pad_multiple_for(precision: str | int | None, configured: int | None = 1) -> int:
    """The multiple batch lengths must be padded to under `precision`.

    Transformer Engine's FP8 GEMMs need the rows B*S / B*T of every projection divisible by 8
    (transformer_engine/pytorch/utils.py `assert_dim_for_fp8_exec`; see
    `litmt.data.batching.collate.collate`). A `configured` multiple (`data.pad_to_multiple`; None or 1 =
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
