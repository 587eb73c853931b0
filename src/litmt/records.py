"""Result records: each measured number litmt publishes lives in one JSON file under
``docs/results/records/<id>.json``, written by the run that measured it (finalize with
``finalize.record=ID``, a benchmark with ``--record ID``). The results page
(``python -m reports.results_page``) is generated from them, and the README and the docs quote
a number as a link whose title names its record and key, which a test checks against the
record (tests/docs/test_numbers.py).

A record::

    {"id": "multi30k_cpu", "title": "...", "date": "2026-12-05T04:10Z",
     "machine": "2-core AMD EPYC 7B13 (CPU only), torch 2.13.0",
     "command": "python scripts/train.py experiment=multi30k_cpu ...",
     "source": "notebook/2026-12-05-....md",   # the page that describes the run (optional)
     "values": {"test2016_bleu": 40.16, ...},  # numbers only
     "units": {"test2016_bleu": "BLEU"}, "notes": "..."}
"""

from __future__ import annotations

import json
import platform
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from litmt.errors import ConfigError
from litmt.runtime.threads import usable_cores

RECORDS_DIR = Path("docs") / "results" / "records"
"""where records live, relative to the repository root"""

_ID = re.compile(r"[a-z0-9][a-z0-9_]*")


def is_record_id(text: str) -> bool:
    """Whether `text` is a valid record id (and value key): snake_case, ``[a-z0-9_]``."""
    return bool(_ID.fullmatch(text))


@dataclass
class Record:
    """One measured result: what was run, where, when, and the numbers it printed."""

    id: str
    """the file stem, snake_case; quoted as ``<id>.<value key>``"""
    title: str
    """one line: what was measured"""
    date: str
    """when, in UTC (``YYYY-MM-DDTHH:MMZ`` or ``YYYY-MM-DD``)"""
    machine: str
    """the machine it ran on (CPU model and cores, GPU)"""
    command: str
    """the command that printed the numbers"""
    values: dict[str, float]
    """the numbers, by key"""
    units: dict[str, str] = field(default_factory=dict)
    """the unit of each value key that has one (BLEU, sentences/s, ...)"""
    source: str = ""
    """the docs page (relative to docs/) that describes the run, if any"""
    notes: str = ""
    """what a reader must know to use the numbers"""

    def __post_init__(self) -> None:
        if not is_record_id(self.id):
            raise ConfigError(f"record id {self.id!r} must be snake_case ([a-z0-9_])")
        for key, value in self.values.items():
            if not is_record_id(key):
                raise ConfigError(f"record {self.id}: value key {key!r} must be snake_case")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"record {self.id}: {key} is {value!r}, not a number")
        if extra := sorted(set(self.units) - set(self.values)):
            raise ConfigError(f"record {self.id}: units for keys with no value: {extra}")


def utc_now() -> str:
    """The current time as a record date (``YYYY-MM-DDTHH:MMZ``)."""
    return time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description() -> str:
    """This machine in one line: cores usable by this process, CPU model, GPU (if torch sees
    one) and the torch version."""
    text = f"{usable_cores()}-core {_cpu_model()}"
    try:
        import torch
    except ImportError:
        return text + " (CPU only)"
    gpu = (
        f", {torch.cuda.device_count()}× {torch.cuda.get_device_name(0)}"
        if torch.cuda.is_available()
        else " (CPU only)"
    )
    return f"{text}{gpu}, torch {torch.__version__}"


def record_path(record_id: str, root: Path | str = ".") -> Path:
    """``<root>/docs/results/records/<record_id>.json``."""
    return Path(root) / RECORDS_DIR / f"{record_id}.json"


def write_record(record: Record, root: Path | str = ".") -> Path:
    """Write `record` (replacing the one with its id) and return its path."""
    path = record_path(record.id, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(asdict(record), indent=2, ensure_ascii=False) + "\n"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def read_record(path: Path | str) -> Record:
    """One record file.

    Raises:
        ConfigError: not JSON, missing or unknown keys, a value that is not a number, or a
            file name that is not its id.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a record is a JSON object")
    known = set(Record.__dataclass_fields__)
    if unknown := sorted(set(data) - known):
        raise ConfigError(f"{path}: unknown keys {unknown} (known: {sorted(known)})")
    try:
        record = Record(**data)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if record.id != path.stem:
        raise ConfigError(f"{path}: id {record.id!r} differs from the file name")
    return record


def read_records(root: Path | str = ".") -> dict[str, Record]:
    """Every record under ``<root>/docs/results/records``, by id."""
    folder = Path(root) / RECORDS_DIR
    return {p.stem: read_record(p) for p in sorted(folder.glob("*.json"))}


def value_of(records: Mapping[str, Record], ref: str) -> float:
    """The value ``<id>.<key>`` names.

    Raises:
        KeyError: no such record or key (the message names what exists).
    """
    record_id, _, key = ref.partition(".")
    if record_id not in records:
        raise KeyError(f"no record {record_id!r} (records: {sorted(records)})")
    values = records[record_id].values
    if key not in values:
        raise KeyError(f"record {record_id!r} has no value {key!r} (values: {sorted(values)})")
    return values[key]


def format_value(value: float, decimals: int) -> str:
    """`value` as a quote with `decimals` decimals, thousands separated by commas."""
    return f"{value:,.{decimals}f}"
