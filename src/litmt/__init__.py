"""litmt: Transformer machine translation on Lightning + Hydra with swappable attention."""

from __future__ import annotations

from typing import Any

from litmt.errors import LitmtError

__version__ = "0.2.0"  # CHANGELOG.md; pyproject.toml reads it from here


def __getattr__(name: str) -> Any:
    # Lazy: `import litmt` stays light; `from litmt import Translator` loads the decoder stack.
    if name == "Translator":
        from litmt.decoding.translator import Translator

        return Translator
    if name == "load_translator":  # engine="torch" | "ct2" (CTranslate2)
        from litmt.deploy.loader import load_translator

        return load_translator
    raise AttributeError(f"module 'litmt' has no attribute {name!r}")


__all__ = ["LitmtError", "Translator", "__version__", "load_translator"]
