"""`DecodeConfig`: every decoding setting, validated, with the project's one set of defaults.

`litmt.decoding.search.dispatch.decode` runs it; the searches (`litmt.decoding.search.beam`) take their keyword defaults
from it; job configs override it (`DecodeConfig.from_options`: absent keys keep the base, null
is None for the one field that takes it, ``seed``). A job's composed decoding node lists every
key (the YAML shows the real defaults), so `job_options` keeps only the keys the job chose, and
an export's own decoding defaults (its ``litmt.json``) stay in force for the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from litmt.config import check_keys, check_null, command_line_keys, nullable_fields
from litmt.errors import ConfigError

METHODS = ("beam", "greedy", "sample")


@dataclass(frozen=True)
class DecodeConfig:
    """Every decoding setting, with the one set of defaults (each field's docstring is its
    one documentation; `conf/decoding/default.yaml` shows it, checked by
    `tests/unit/test_config_defaults.py`)."""

    method: str = "beam"
    """beam | greedy | sample"""
    beam_size: int = 5
    """beam width K; 1 = greedy"""
    length_penalty: float = 1.0
    """GNMT alpha: score = log P / ((5 + |y|) / 6) ** alpha (ranking and reported scores)"""
    max_len_a: float = 1.2
    """output budget: floor(max_len_a * source subwords + max_len_b), clamped to the model's
    max_positions - 1"""
    max_len_b: int = 10
    """the constant term of the output budget (see max_len_a)"""
    min_len: int = 0
    """no eos before this many subword tokens (the budget still wins)"""
    n_best: int = 1
    """hypotheses per input: the best n of the beam (<= beam_size), or n samples"""
    top_k: int = 0
    """method=sample: draw from the k most likely tokens; 0 = all"""
    top_p: float = 1.0
    """method=sample: draw from the smallest set of most likely tokens whose probability
    reaches top_p; 1.0 = all"""
    temperature: float = 1.0
    """method=sample: divide the logits by this; 0 = always the most likely token"""
    seed: int | None = 0
    """method=sample: generator seed (each decode call starts from it: same seed, same input,
    same samples); null = torch's global generator"""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.beam_size < 1:
            raise ConfigError(f"beam_size must be at least 1, got {self.beam_size}")
        if self.min_len < 0:
            raise ConfigError(f"min_len must be >= 0, got {self.min_len}")
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ConfigError(
                f"max_len_a and max_len_b must be >= 0, got {self.max_len_a}, {self.max_len_b}"
            )
        if self.n_best < 1:
            raise ConfigError(f"n_best must be at least 1, got {self.n_best}")
        if self.method == "beam" and self.n_best > self.beam_size:
            raise ConfigError(
                f"n_best must be between 1 and beam_size={self.beam_size}, got {self.n_best}: "
                f"n_best={self.n_best} needs beam_size >= {self.n_best}"
            )
        if self.method == "greedy" and self.n_best != 1:
            raise ConfigError(f"greedy decoding gives one hypothesis; n_best={self.n_best}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = no cut), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any] | None = None, base: DecodeConfig | None = None
    ) -> DecodeConfig:
        """`base` (default: the defaults) with the DecodeConfig fields that `options` sets.

        Keys of `options` that are not fields are ignored (a job config holds other keys
        too); an absent field keeps `base`'s value; null is None where the field takes it
        (``seed``: torch's global generator). Works on dicts and DictConfigs.

        Raises:
            ConfigError: a value of the wrong type, or null for a field that needs a value.
        """
        base = base or cls()
        if not options:
            return base
        changes = {}
        for f in dataclasses.fields(cls):
            if f.name not in options:
                continue
            value = options[f.name]
            check_null(cls, f.name, value, "decoding")
            if value is None:
                changes[f.name] = None
                continue
            kind = type(f.default)  # every default is set: str, int or float
            if kind is int and isinstance(value, float) and not value.is_integer():
                raise ConfigError(f"decoding option {f.name} must be a whole number, got {value!r}")
            try:
                changes[f.name] = kind(value)  # e.g. YAML's 1 for a float field
            except (TypeError, ValueError):
                raise ConfigError(
                    f"decoding option {f.name} must be of type {kind.__name__}, got {value!r}"
                ) from None
        return dataclasses.replace(base, **changes)

    @property
    def effective_method(self) -> str:
        """The search that runs: beam with K = 1 is greedy."""
        if self.method == "beam" and self.beam_size == 1:
            return "greedy"
        return self.method


def decoding_options(config: DecodeConfig | None, options: Mapping[str, Any]) -> DecodeConfig:
    """`config` with keyword `options` (DecodeConfig fields) applied: the Python API of
    ``Translator.translate(..., beam_size=4)``. None keeps `config`'s value for a field that
    needs one (``beam_size=None``), and is None where the field takes it (``seed=None``: torch's
    global generator).

    Raises:
        ConfigError: a key that is not a decoding option, or a value `from_options` refuses.
    """
    check_keys(options, (f.name for f in dataclasses.fields(DecodeConfig)), "decoding option")
    nullable = nullable_fields(DecodeConfig)
    given = {k: v for k, v in options.items() if v is not None or k in nullable}
    return DecodeConfig.from_options(given, base=config)


def job_options(node: Mapping[str, Any] | None, named: Iterable[str] | None = None) -> dict:
    """The keys of a job's composed decoding node that override the translator's own defaults.

    The node lists every field (conf/decoding/default.yaml shows the real defaults), so a key
    overrides only when the job chose it: its value differs from DecodeConfig's default, or the
    command line names it (`named`; None = the running Hydra job's, `command_line_keys`). A key
    that merely repeats the default keeps the base's value: an export's ``litmt.json`` beam size
    stays in force unless ``beam_size=...`` is given. Other keys of `node` are dropped.
    """
    named = command_line_keys("decoding") if named is None else frozenset(named)
    defaults = DecodeConfig()
    chosen = {}
    for f in dataclasses.fields(DecodeConfig):
        if node is None or f.name not in node:
            continue
        value = node[f.name]
        default = getattr(defaults, f.name)
        same = value == default and (value is None) == (default is None)
        if f.name in named or not same:
            chosen[f.name] = value
    return chosen


__all__ = ["METHODS", "DecodeConfig", "decoding_options", "job_options"]
