"""Each setting is defined once: its default and its doc live in one dataclass field; the YAML
node that exposes it sets it to that real default and carries the field's docstring as its
comment (`litmt.config.render_yaml`), so a reader sees the default and ``null`` can mean None.
This test fails when a YAML key is missing, unknown, set to another value than the default
(a default changed by hand in the YAML), or documented differently from the code. Keys wired
to an interpolation (``seed: ${seed}``) keep it.

To fix a failure after changing a dataclass, print the block the test expects:
``python -c "from litmt.config import render_yaml; from MODULE import CLS; print(render_yaml(CLS))"``
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from litmt.config import default_of, yaml_comment, yaml_comments
from reports.settings_reference import load_class

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class Case:
    """One YAML node that mirrors one settings dataclass."""

    file: str  # under conf/
    cls: str  # "module:Class"
    path: tuple[str, ...] = ()  # the node inside the file (() = the file's top level)
    others: frozenset[str] = field(default_factory=frozenset)  # keys of the node owned elsewhere
    wired: frozenset[str] = field(default_factory=frozenset)  # (dotted) keys set to ${...}
    runtime: frozenset[str] = field(default_factory=frozenset)  # null here, filled in by the job
    elsewhere: frozenset[str] = field(default_factory=frozenset)  # fields another group sets


CASES = [
    Case("decoding/default.yaml", "litmt.decoding.config:DecodeConfig"),
    Case(
        "data/base.yaml",
        "litmt.data.config:DataConfig",
        wired=frozenset({"seed", "cache_dir", "tokenizer.seed"}),
    ),
    Case("load/default.yaml", "litmt.deploy.loader:LoadConfig"),
    Case(
        "serve.yaml",
        "litmt.deploy.server.config:ServeConfig",
        others=frozenset({"explorer", "max_tokens", "hydra"}),
    ),
    Case(
        "distill.yaml",
        "litmt.decoding.distill:DistillConfig",
        others=frozenset({"compute_type", "quantization", "decoding", "seed", "hydra"}),
    ),
    Case(
        "student.yaml", "litmt.cli.distillation.student:StudentConfig", others=frozenset({"hydra"})
    ),
    Case(
        "translate.yaml",
        "litmt.cli.translate:TranslateConfig",
        others=frozenset({"scores", "decoding", "hydra"}),  # scores: return_scores' old name
    ),
    Case(
        "evaluate.yaml",
        "litmt.cli.evaluate:EvaluateConfig",
        others=frozenset({"seed", "decoding", "task_name", "hydra"}),
    ),
    Case(
        "model/base.yaml",
        "litmt.models.config:TransformerConfig",
        runtime=frozenset({"src_vocab_size", "tgt_vocab_size"}),  # from the tokenizer
        elsewhere=frozenset({"attention"}),  # conf/attention/ (@package model.attention)
    ),
    Case(
        "average_checkpoints.yaml",
        "litmt.cli.average:AverageConfig",
        others=frozenset({"inputs", "hydra"}),  # inputs: ckpt_path's old name (load group)
    ),
    Case("import_hf.yaml", "litmt.cli.import_hf:ImportHFConfig", others=frozenset({"hydra"})),
    Case(
        "visualize_attention.yaml",
        "litmt.cli.visualize:VisualizeConfig",
        others=frozenset({"device", "hydra"}),  # device: the load group's, set to cpu here
    ),
    Case("finalize.yaml", "litmt.cli.finalize:FinalizeConfig", others=frozenset({"hydra"})),
    Case("score.yaml", "litmt.cli.score:ScoreConfig", others=frozenset({"decoding", "hydra"})),
    Case("export.yaml", "litmt.cli.export:ExportConfig", others=frozenset({"decoding", "hydra"})),
]


def same_value(raw: Any, default: Any) -> bool:
    """The YAML value `raw` is the dataclass default (1 for a float's 1.0 counts; a bool only
    matches a bool)."""
    if isinstance(raw, bool) or isinstance(default, bool):
        return raw is default
    if isinstance(default, float) and isinstance(raw, int | float):
        return raw == default
    return type(raw) is type(default) and raw == default


def check_node(
    node: DictConfig,
    cls: type,
    comments: dict[tuple[str, ...], str],
    path: tuple[str, ...],
    case: Case,
) -> list[str]:
    """Every difference between the YAML `node` at `path` and the dataclass `cls`."""
    problems = []
    names = {f.name for f in dataclasses.fields(cls)}
    keys = (
        set(node.keys()) - {"_target_", "defaults"} - (case.others if path == case.path else set())
    )
    where = ".".join(path) or "(top level)"
    for key in sorted(names - keys - (case.elsewhere if path == case.path else set())):
        problems.append(f"{where}: {key} is a field of {cls.__name__} but missing from the YAML")
    for key in sorted(keys - names):
        problems.append(f"{where}: {key} is not a field of {cls.__name__}")
    for f in dataclasses.fields(cls):
        if f.name not in keys:
            continue
        key_path = (*path, f.name)
        default = default_of(f)
        raw: Any = OmegaConf.to_container(node, resolve=False)[f.name]  # type: ignore[index]
        if dataclasses.is_dataclass(default):
            if not isinstance(node[f.name], DictConfig):
                problems.append(f"{where}.{f.name}: must be a block of {type(default).__name__}")
            else:
                problems += check_node(node[f.name], type(default), comments, key_path, case)
        elif ".".join(key_path[len(case.path) :]) in case.runtime:
            if raw is not None:
                problems.append(
                    f"{where}.{f.name}: filled in at run time, must be null, got {raw!r}"
                )
        elif ".".join(key_path[len(case.path) :]) in case.wired:
            if not (isinstance(raw, str) and raw.startswith("${")):
                problems.append(f"{where}.{f.name}: expected an interpolation, got {raw!r}")
        elif not same_value(raw, default):
            problems.append(
                f"{where}.{f.name}: set to {raw!r}, but the default of "
                f"{cls.__name__}.{f.name} is {default!r}: show the default (change it in the code)"
            )
        want = " ".join(yaml_comment(cls, f.name).split())
        got = " ".join(comments.get(key_path, "").split())
        if got != want:
            problems.append(f"{where}.{f.name}: comment {got!r} != the field's doc {want!r}")
    return problems


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.file}:{c.cls.split(':')[1]}")
def test_yaml_mirrors_its_dataclass(case: Case) -> None:
    file = CONF / case.file
    node = OmegaConf.load(file)
    for key in case.path:
        node = node[key]
    problems = check_node(node, load_class(case.cls), yaml_comments(file), case.path, case)
    assert not problems, "\n".join(problems)


def test_the_check_fails_on_a_drifted_yaml(tmp_path: Path) -> None:
    """The checker is not vacuous: a default changed by hand, a changed comment and a missing
    key fail."""
    text = (CONF / "decoding/default.yaml").read_text(encoding="utf-8")
    drifted = text.replace("beam_size: 5 ", "beam_size: 4 ").replace("max_positions - 1", "x")
    drifted = "\n".join(line for line in drifted.splitlines() if not line.startswith("top_k:"))
    file = tmp_path / "default.yaml"
    file.write_text(drifted, encoding="utf-8")
    cls = load_class("litmt.decoding.config:DecodeConfig")
    problems = check_node(OmegaConf.load(file), cls, yaml_comments(file), (), CASES[0])
    assert any("beam_size: set to 4" in p for p in problems), problems
    assert any("max_len_a: comment" in p for p in problems), problems
    assert any("top_k is a field of DecodeConfig but missing" in p for p in problems), problems


@pytest.mark.parametrize("name", ["small", "tiny", "big"])
def test_model_variants_list_fields_with_their_docs(name: str) -> None:
    """A model variant inherits conf/model/base.yaml and lists only its differences: each a field
    of TransformerConfig, commented with the field's doc, and the composed model is valid."""
    cls = load_class("litmt.models.config:TransformerConfig")
    file = CONF / "model" / f"{name}.yaml"
    node = OmegaConf.load(file)
    comments = yaml_comments(file)
    names = {f.name for f in dataclasses.fields(cls)}
    problems = [f"{key} is not a field" for key in node if key != "defaults" and key not in names]
    for key in node:
        if key in names:
            want = " ".join(yaml_comment(cls, key).split())
            if " ".join(comments.get((key,), "").split()) != want:
                problems.append(f"{key}: comment != the field's doc {want!r}")
    assert not problems, "\n".join(problems)
    base = OmegaConf.load(CONF / "model" / "base.yaml")
    merged = OmegaConf.to_container(
        OmegaConf.merge(base, {k: v for k, v in node.items() if k != "defaults"})
    )
    cls(**{**merged, "src_vocab_size": 100})  # valid: ConfigError otherwise
