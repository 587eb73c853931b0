"""What a kernel can serve and whether it can run here, checked before the first batch.

- `BackendSupport`: what a backend declares (masks, dropout, devices, dtypes, packages);
- `AttentionRequest`: what a model site will ask of its kernel; `check_request` compares them;
- `package_problem` / `import_packages`: whether a backend's optional packages import with
  every name it calls (an installed package can still be unusable: a namespace
  ``flash_attn`` without FlashAttention-2, a compiled extension that fails to load);
- `reject_unknown_options` / `int_option`: the backends' option checks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from litmt.errors import BackendError

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)  # what flash-attn and TE kernels take
# What a broken install raises on import: a missing name or module (ImportError), a module
# without the attribute (AttributeError), a shared library that fails to load (OSError).
UNUSABLE_ERRORS = (ImportError, AttributeError, OSError)


@dataclass(frozen=True)
class BackendSupport:
    """What a backend can serve. Checked when the model is built, not on the first batch."""

    padding_mask: bool = True  # honours key_padding_mask
    causal: bool = True  # honours causal=True
    dropout: bool = True  # honours dropout_p > 0 in training
    weights: bool = False  # returns its own weights; False: heatmaps recompute them with math
    cross: bool = True  # serves cross-attention (queries and keys from two sequences)
    devices: tuple[str, ...] = ("cpu", "cuda")  # torch device types it runs on
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES  # input dtypes it accepts
    exact: bool = True  # computes full softmax attention (parity with `math`)
    packages: tuple[str, ...] = ()  # optional import names it needs
    requires: tuple[str, ...] = ()  # "module:name" it calls; absent = the package is unusable
    extra: str | None = None  # the pip extra that installs them
    notes: str = ""  # one line describing the backend (docs, benchmark tables)
    min_cuda_capability: tuple[int, int] | None = None  # e.g. (8, 0) for sm80+


@dataclass
class AttentionRequest:
    """What a model site will ask of its kernel; used for build-time validation."""

    causal: bool = False
    padding_mask: bool = False
    dropout: bool = False
    device: str | torch.device | None = None
    dtype: torch.dtype | None = None
    site: str = "attention"


def _check_device(where: str, s: BackendSupport, device: str | torch.device) -> None:
    dev = torch.device(device)
    if dev.type not in s.devices:
        raise BackendError(
            f"{where} runs only on {'/'.join(s.devices)}, not on '{dev.type}'; "
            f"choose attention=sdpa or attention=math there"
        )
    if dev.type == "cuda" and s.min_cuda_capability is not None:
        if not torch.cuda.is_available():
            raise BackendError(f"{where} needs CUDA, which this machine does not have")
        cap = torch.cuda.get_device_capability(dev)
        if cap < s.min_cuda_capability:
            need = "sm{}{}".format(*s.min_cuda_capability)
            raise BackendError(f"{where} needs a GPU of {need} or newer, found sm{cap[0]}{cap[1]}")


def check_request(name: str, s: BackendSupport, request: AttentionRequest) -> None:
    """Raise `BackendError` if backend `name`, declaring `s`, cannot serve `request`."""
    where = f"attention backend '{name}' (at {request.site})"
    if request.device is not None:
        _check_device(where, s, request.device)
    if request.dtype is not None and request.dtype not in s.dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in s.dtypes)
        raise BackendError(
            f"{where} does not run in {str(request.dtype).replace('torch.', '')}; "
            f"it supports {names} (set trainer.precision accordingly)"
        )
    if request.causal and not s.causal:
        raise BackendError(f"{where} cannot do causal attention")
    if request.padding_mask and not s.padding_mask:
        raise BackendError(f"{where} cannot apply a key padding mask")
    if request.dropout and not s.dropout:
        raise BackendError(f"{where} does not support attention dropout; set it to 0")
    if request.site == "cross" and not s.cross:
        raise BackendError(
            f"{where} needs query and key positions from the same sequence; "
            "use model.attention.cross=sdpa"
        )


def _one_line(exc: BaseException) -> str:
    """`exc` as "Type: first line of its message"."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _is_absent(exc: ModuleNotFoundError, pkg: str) -> bool:
    """True if `exc` says `pkg` itself (or a parent package of it) is not installed."""
    return exc.name is not None and (pkg == exc.name or pkg.startswith(exc.name + "."))


def package_problem(s: BackendSupport) -> tuple[str, str] | None:
    """Why the optional packages of `s` cannot serve here, or None when they can.

    Each package is imported, then each ``module:name`` of ``s.requires`` looked up.

    Returns:
        ("not installed", package), or ("not usable", "<what>: <Error>: <message>") when a
        package is there but an import or a name fails (one line), or None.
    """
    for pkg in s.packages:
        try:
            importlib.import_module(pkg)
        except ModuleNotFoundError as exc:
            if _is_absent(exc, pkg):
                return "not installed", pkg
            return "not usable", f"{pkg}: {_one_line(exc)}"
        except UNUSABLE_ERRORS as exc:
            return "not usable", f"{pkg}: {_one_line(exc)}"
    for spec in s.requires:
        module, _, attr = spec.partition(":")
        try:
            getattr(importlib.import_module(module), attr)
        except UNUSABLE_ERRORS as exc:
            return "not usable", f"{module}.{attr}: {_one_line(exc)}"
    return None


def import_packages(name: str, s: BackendSupport) -> list[ModuleType]:
    """The optional packages of backend `name` (declaring `s`), imported lazily.

    Raises:
        BackendError: a package is not installed, or is installed but not usable (see
            `package_problem`); the message names the pip extra that installs it.
    """
    problem = package_problem(s)
    if problem is not None:
        install = f"pip install 'litmt[{s.extra}]'" if s.extra else "pip"
        kind, what = problem
        if kind == "not installed":
            raise BackendError(
                f"attention backend '{name}' needs the '{what}' package, which is not "
                f"installed (ModuleNotFoundError); install it with {install}"
            )
        raise BackendError(
            f"attention backend '{name}' cannot use its installed package ({what}); "
            f"reinstall it with {install}, or use attention=sdpa"
        )
    return [importlib.import_module(pkg) for pkg in s.packages]


def reject_unknown_options(backend: str, unknown: dict[str, Any], valid: tuple[str, ...]) -> None:
    """Raise `BackendError` naming the valid options if a backend got options it lacks."""
    if unknown:
        raise BackendError(
            f"attention backend '{backend}' has no option(s) {sorted(unknown)}; "
            f"valid options: {', '.join(valid)}"
        )


def int_option(name: str, value: Any, backend: str, minimum: int) -> int:
    """`value` if it is an int >= `minimum` (bools refused), else `BackendError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BackendError(
            f"attention backend '{backend}': option {name} must be an integer >= {minimum}, "
            f"got {value!r}"
        )
    return value
