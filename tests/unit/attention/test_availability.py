"""Whether a kernel package can serve: installed is not enough. A package is imported with
every name its backend calls (`BackendSupport.requires`), and a broken one is "not usable:
<why>" (for scripts/gpu_check.py) and a `BackendError` naming the fix (for the model), never
an ImportError deep inside a backend's constructor."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulations import flash_attn as flash_emulation

from litmt.attention import build_backend, get_backend_class
from litmt.errors import BackendError

FAKES = ("flash_attn", "xformers", "transformer_engine")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for fake packages; none of their modules outlives the test."""
    for name in FAKES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in FAKES]:
        del sys.modules[name]


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


EXTEND_PATH = "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"


def test_a_namespace_flash_attn_without_fa2_is_not_usable(site: Path) -> None:
    """What crashed the GPU check: find_spec finds it and it imports, but it has none of
    FlashAttention-2's functions."""
    write(site, {"flash_attn/__init__.py": EXTEND_PATH})
    assert importlib.util.find_spec("flash_attn") is not None
    why = (
        "flash_attn.flash_attn_func: AttributeError: module 'flash_attn' has no attribute "
        "'flash_attn_func'"
    )
    assert get_backend_class("flash").unavailable() == ("not usable", why)
    with pytest.raises(BackendError) as err:
        build_backend("flash")
    assert str(err.value) == (
        f"attention backend 'flash' cannot use its installed package ({why}); reinstall it "
        "with pip install 'litmt[flash]', or use attention=sdpa"
    )


def test_a_shared_library_that_fails_to_load_is_not_usable(site: Path) -> None:
    write(site, {"xformers/__init__.py": "raise OSError('libcudart.so.12: cannot open shared object file')\n"})  # fmt: skip
    assert get_backend_class("xformers").unavailable() == (
        "not usable",
        "xformers: OSError: libcudart.so.12: cannot open shared object file",
    )
    with pytest.raises(BackendError, match=r"'xformers' cannot use its installed package"):
        build_backend("xformers")


def test_a_missing_compiled_extension_is_not_usable_not_missing(site: Path) -> None:
    """transformer_engine is there, but what it imports is not: not "not installed"."""
    write(
        site,
        {
            "transformer_engine/__init__.py": "",
            "transformer_engine/pytorch.py": "import transformer_engine_torch\n",
        },
    )
    assert get_backend_class("te").unavailable() == (
        "not usable",
        "transformer_engine.pytorch: ModuleNotFoundError: No module named 'transformer_engine_torch'",
    )


def test_an_absent_package_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # the import fails, installed or not
    assert get_backend_class("flash").unavailable() == ("not installed", "flash_attn")


def test_a_complete_package_is_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    flash_emulation.install(monkeypatch, allow_cpu_fp32=False)
    assert get_backend_class("flash").unavailable() is None
    assert get_backend_class("sdpa").unavailable() is None  # no optional package at all
