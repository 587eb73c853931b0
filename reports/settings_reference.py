"""Generate docs/reference/settings.md, the reference of every setting, from the code: each
key's default and doc come from its settings dataclass (the field and the docstring under it,
`litmt.config.field_docs`), or, for the keys no dataclass owns (the training run's own keys,
Lightning's Trainer, callbacks and loggers), from the commented YAML that defines them.

    python -m reports.settings_reference            # rewrite docs/reference/settings.md
    python -m reports.settings_reference --check    # exit 1 if the page is out of date

tests/docs/test_settings_reference.py regenerates the page and compares, so it cannot drift.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from litmt.config import default_of, field_docs, yaml_comments, yaml_scalar

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "settings.md"
CONF = ROOT / "conf"

# (section title, command or config group, conf file, key prefix, "module:Class")
DATACLASS_SECTIONS: list[tuple[str, str, str, str, str]] = [
    ("Model", "`model=...` of train.py", "model/base.yaml", "model.",
     "litmt.models.config:TransformerConfig"),
    ("Data", "`data=...` of train.py", "data/base.yaml", "data.", "litmt.data.config:DataConfig"),
    ("Decoding", "`decoding.*` of every decoding command", "decoding/default.yaml", "decoding.",
     "litmt.decoding.config:DecodeConfig"),
    ("Loading a model", "every command that loads a model", "load/default.yaml", "",
     "litmt.deploy.loader:LoadConfig"),
    ("translate", "scripts/translate.py", "translate.yaml", "", "litmt.cli.translate:TranslateConfig"),
    ("evaluate", "scripts/evaluate.py", "evaluate.yaml", "", "litmt.cli.evaluate:EvaluateConfig"),
    ("score", "scripts/score.py", "score.yaml", "", "litmt.cli.score:ScoreConfig"),
    ("average_checkpoints", "scripts/average_checkpoints.py", "average_checkpoints.yaml", "",
     "litmt.cli.average:AverageConfig"),
    ("finalize", "scripts/finalize.py", "finalize.yaml", "", "litmt.cli.finalize:FinalizeConfig"),
    ("visualize_attention", "scripts/visualize_attention.py", "visualize_attention.yaml", "",
     "litmt.cli.visualize:VisualizeConfig"),
    ("export", "scripts/export.py", "export.yaml", "", "litmt.cli.export:ExportConfig"),
    ("import_hf", "scripts/import_hf.py", "import_hf.yaml", "", "litmt.cli.import_hf:ImportHFConfig"),
    ("serve", "scripts/serve.py", "serve.yaml", "", "litmt.deploy.server.config:ServeConfig"),
    ("distill", "scripts/distill.py", "distill.yaml", "", "litmt.decoding.distill:DistillConfig"),
    ("student", "scripts/student.py", "student.yaml", "",
     "litmt.cli.distillation.student:StudentConfig"),
]  # fmt: skip

# (section title, what it configures, conf file, key prefix, keys owned by a dataclass section)
YAML_SECTIONS: list[tuple[str, str, str, str, frozenset[str]]] = [
    ("Training run", "scripts/train.py's own keys", "train.yaml", "",
     frozenset({"defaults", "hydra"})),
    ("Trainer", "Lightning's `Trainer` arguments (`trainer=...`)", "trainer/default.yaml",
     "trainer.", frozenset({"defaults"})),
    ("Callbacks", "Lightning callbacks (`callbacks=...`)", "callbacks/default.yaml", "callbacks.",
     frozenset({"defaults"})),
    ("Loggers", "W&B and CSV (`logger=...`)", "logger/default.yaml", "logger.",
     frozenset({"defaults"})),
    ("Paths", "where data, logs and runs go (`paths=...`)", "paths/default.yaml", "paths.",
     frozenset({"defaults"})),
]  # fmt: skip

HEADER = """\
# Settings reference

Every setting of every command, with its default and what it does. Generated from the code
by `python -m reports.settings_reference`: a key owned by a settings dataclass shows that
field's default and docstring (the one definition of the setting; the YAML in `conf/` shows
the same default and comment, which a test checks), and the keys no dataclass owns come from
the commented YAML that defines them. Set any key on the command line as a Hydra override,
e.g. `python scripts/translate.py ckpt_path=CKPT decoding.beam_size=5`; `null` means None.
"""


def load_class(spec: str) -> type:
    """``"module:Class"`` → the class."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def cell(text: str, prose: bool = True) -> str:
    """Text safe inside a Markdown table cell (prose: ``<`` and ``>`` escaped, not markup)."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;") if prose else text


def code(value: str) -> str:
    """`value` as inline code that may contain backticks."""
    return f"`` {value} ``" if "`" in value else f"`{value}`"


def dataclass_rows(cls: type, prefix: str) -> list[str]:
    """One table row per field of `cls` (a nested settings dataclass: its fields, dotted)."""
    rows = []
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        default = default_of(f)
        if dataclasses.is_dataclass(default):
            rows += dataclass_rows(type(default), f"{prefix}{f.name}.")
            continue
        shown = "(required)" if default is dataclasses.MISSING else yaml_scalar(default)
        rows.append(
            f"| `{prefix}{f.name}` | {cell(code(shown), prose=False)} | {cell(docs.get(f.name, ''))} |"
        )
    return rows


def yaml_rows(file: Path, prefix: str, skip: frozenset[str]) -> list[str]:
    """One table row per leaf key of a commented YAML file (its value and comment)."""
    comments = yaml_comments(file)
    data = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    rows: list[str] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        for key, value in node.items():
            if not path and key in skip:
                continue
            here = (*path, str(key))
            if isinstance(value, dict) and value:
                walk(value, here)
                continue
            shown = yaml_scalar(value)
            rows.append(
                f"| `{prefix}{'.'.join(here)}` | {cell(code(shown), prose=False)} "
                f"| {cell(comments.get(here, ''))} |"
            )

    walk(data, ())
    return rows


TABLE_HEAD = ["| key | default | what it does |", "|---|---|---|"]


def render() -> str:
    """The whole page."""
    parts = [HEADER, "## Training\n"]
    for title, what, file, prefix, skip in YAML_SECTIONS:
        rows = yaml_rows(CONF / file, prefix, skip)
        parts.append(f"### {title}\n\n{what}; defined in `conf/{file}`.\n")
        parts.append("\n".join(TABLE_HEAD + rows) + "\n")
    parts.append("## Settings dataclasses\n")
    for title, what, file, prefix, spec in DATACLASS_SECTIONS:
        cls = load_class(spec)
        parts.append(
            f"### {title}\n\n{what}; `{spec.replace(':', '.')}`, shown in `conf/{file}`.\n"
        )
        parts.append("\n".join(TABLE_HEAD + dataclass_rows(cls, prefix)) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with --check compare it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(
                f"{PAGE} is out of date: run python -m reports.settings_reference", file=sys.stderr
            )
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text, encoding="utf-8")
    print(PAGE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
