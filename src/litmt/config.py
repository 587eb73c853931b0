"""The one home of the rules every settings object follows.

A setting is a field of one dataclass (`TransformerConfig`, `DecodeConfig`, `DataConfig`,
`ServeConfig`, `TranslateConfig`, ...) with its default and, on the line under it, a docstring
that is its one documentation (litgpt's style). The Hydra YAML a user reads sets each key to
that real default with the docstring as its comment (`render_yaml`); the test
`tests/unit/test_config_defaults.py` fails when a YAML default or comment differs from the
dataclass. So ``null`` in a YAML means None, for a field whose type allows it (``seed: null``),
and an absent key keeps the default.

This module holds what every command and every dataclass share:

- `plain`: a DictConfig/ListConfig (or any mapping/list) as plain dicts/lists;
- `check_keys`: the one unknown-key check, with a close-match hint;
- `renamed_keys`: old spellings of a key keep working for one release, with a deprecation line;
- `build`: a dataclass from a mapping (absent = the default, null = None where allowed);
- `job_config`: a command's own dataclass from the top-level keys of its composed config;
- `nullable_fields`, `check_null`: which fields take None, and the one refusal of a null;
- `command_line_keys`: the keys of a block that the running job's command line sets;
- `field_docs`: the docstrings under a dataclass's fields;
- `render_yaml`, `yaml_comment`: a dataclass as YAML keys set to their real defaults, whose
  comments are the field docstrings, what the YAML test compares;
- `renamed_attribute`: a module's old class names, kept one release with a warning.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import logging
import re
import textwrap
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from litmt.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

REMOVED_IN = "0.3.0"
"""the release in which every deprecated (renamed) key and name stops being accepted
(CHANGELOG.md lists them)"""


def plain(value: Any) -> Any:
    """DictConfig/ListConfig (or any mapping/list) → plain dict/list, without importing omegaconf."""
    if isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def check_keys(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """Refuse keys of `where` (e.g. ``data.tokenizer``) that are not in `known`.

    Raises:
        ConfigError: one line naming the unknown keys, a close match if there is one, and
            the known keys.
    """
    known = sorted(set(known))
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        if close:
            hints.append(f"{key} -> {close[0]}?")
    hint = f" (did you mean {', '.join(hints)})" if hints else ""
    raise ConfigError(f"unknown {where} keys {unknown}{hint}; known: {', '.join(known)}")


def renamed_keys(data: Mapping[str, Any], renames: Mapping[str, str], where: str) -> dict:
    """`data` with each old key of `renames` (old → new) moved to its new name; a dotted new
    name (``access.req_limit``) moves the key into that block.

    Each old key still works for one release and logs one deprecation line naming the keys as
    the user types them, e.g. ``serve: model_path is deprecated ...; use ckpt_path``.

    Raises:
        ConfigError: both the old and the new spelling are set (to different values).
    """
    out = dict(data)
    for old, new in renames.items():
        if old not in out:
            continue
        value = out.pop(old)
        *blocks, leaf = new.split(".")
        target = out
        for block in blocks:  # copies: the caller's nested mappings stay as they were
            target[block] = dict(target.get(block) or {})
            target = target[block]
        given = target.get(leaf)
        if given is not None and value is not None and given != value:
            raise ConfigError(
                f"{where}: {old} is the old name of {new}; set only {new} "
                f"(got {old}={value!r} and {new}={given!r})"
            )
        if value is not None or leaf not in target:
            target[leaf] = value
        log.warning(
            "%s: %s is deprecated and will be removed in litmt %s; use %s",
            where,
            old,
            REMOVED_IN,
            new,
        )
    return out


def build(
    cls: type[T],
    data: Mapping[str, Any] | None,
    where: str,
    renames: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
) -> T:
    """The dataclass `cls` from `data`: unknown keys refused, absent keys keep the default, a
    null key is None (refused for a field whose type does not allow None).

    Args:
        cls: a dataclass.
        data: its keys (a dict or DictConfig); None = every default.
        where: the config path for messages, e.g. ``serve``.
        renames: old key → new key, accepted with a deprecation line (`renamed_keys`).
        ignore: keys of `data` that belong to something else (dropped, never refused).

    Raises:
        ConfigError: an unknown key, or null for a field that does not take None.
    """
    values = plain(data) or {}
    values = renamed_keys(values, renames or {}, where)
    for key in ignore:
        values.pop(key, None)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    check_keys(values, names, where)
    for key, value in values.items():
        check_null(cls, key, value, where)
    return cls(**values)


def job_config(cls: type[T], cfg: Any, where: str) -> T:
    """The dataclass `cls` from the top-level keys of a composed job config that are its fields
    (`build`; the job's other keys belong to its config groups).

    Raises:
        ConfigError: null for a field that needs a value, or a value the dataclass refuses.
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    return build(cls, {k: cfg[k] for k in names if k in cfg}, where)


@functools.cache
def nullable_fields(cls: type) -> frozenset[str]:
    """The fields of the dataclass `cls` whose type allows None (``int | None``, ``Any``),
    read from the annotation's text (no import of the names it mentions)."""
    names = set()
    for f in dataclasses.fields(cls):
        text = f.type if isinstance(f.type, str) else repr(f.type)
        if re.search(r"\b(None|Any|Optional)\b", text):
            names.add(f.name)
    return frozenset(names)


def check_null(cls: type, key: str, value: Any, where: str) -> None:
    """Refuse a null `value` for the field `key` of `cls` when its type does not allow None.

    Raises:
        ConfigError: one line naming the key, its default and how to keep it.
    """
    if value is not None or key in nullable_fields(cls):
        return
    field = {f.name: f for f in dataclasses.fields(cls)}[key]
    default = default_of(field)
    shown = "" if dataclasses.is_dataclass(default) else f" (default {yaml_scalar(default)})"
    raise ConfigError(
        f"{where}.{key} cannot be null; give it a value or drop the key to keep its default{shown}"
    )


def command_line_keys(block: str) -> frozenset[str]:
    """The keys of `block` (e.g. ``decoding``) that the running Hydra job's command line sets
    (``decoding.beam_size=5``, also with ``+``/``++``); empty outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig  # only jobs started by Hydra have any

    if not HydraConfig.initialized():
        return frozenset()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        path = str(override).lstrip("+~").split("=", 1)[0]
        head, _, key = path.partition(".")
        if head == block and key:
            keys.add(key.split(".", 1)[0])
    return frozenset(keys)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → the docstring written on the line(s) under it, joined into one line.

    Fields without one are absent. Read from the class's source with `ast` (litgpt's
    convention: the string literal right after an annotated assignment documents it).
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def yaml_scalar(value: Any) -> str:
    """`value` as YAML flow text (``null``, ``true``, ``[a, b]``, ``{k: v}``, ``.inf``)."""
    import yaml  # PyYAML, a dependency of omegaconf; only the YAML writers need it

    if isinstance(value, float) and value == float("inf"):
        return ".inf"
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").strip()


def default_of(field: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory called), or `dataclasses.MISSING`."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def yaml_comment(cls: type, name: str) -> str:
    """The comment a YAML key of `cls`'s field `name` carries: its docstring (the value on the
    key is the default itself, so the comment never repeats it)."""
    return field_docs(cls).get(name, "")


def render_yaml(cls: type, indent: int = 0) -> str:
    """`cls`'s fields as YAML keys set to their real defaults, each with its `yaml_comment`;
    a nested dataclass field becomes a block of its own keys."""
    pad = " " * indent
    lines = []
    for field in dataclasses.fields(cls):
        default = default_of(field)
        if dataclasses.is_dataclass(default):
            lines.append(f"{pad}{field.name}:  # {yaml_comment(cls, field.name)}")
            lines.append(render_yaml(type(default), indent + 2).rstrip("\n"))
        else:
            value = yaml_scalar(default)
            lines.append(f"{pad}{field.name}: {value}  # {yaml_comment(cls, field.name)}")
    return "\n".join(lines) + "\n"


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


def _split_comment(rest: str) -> tuple[str, str | None]:
    """A YAML line's value text and its comment (a # outside quotes, after a space)."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip(), rest[i + 1 :].strip()
    return rest.strip(), None


def yaml_comments(path: Path) -> dict[tuple[str, ...], str]:
    """A commented YAML file's (key path) → its comment: the inline one plus comment-only
    lines indented under it (how conf/ documents a key that no dataclass owns)."""
    comments: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    last: tuple[tuple[str, ...], int] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and last is not None:
            indent = len(line) - len(line.lstrip())
            if indent > last[1]:
                comments[last[0]] = f"{comments.get(last[0], '')} {stripped[1:].strip()}".strip()
                continue
        m = _KEY.match(line)
        if not m:
            last = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        key = tuple(k for _, k in stack)
        _, comment = _split_comment(m["rest"])
        comments[key] = comment or ""
        last = (key, indent)
    return comments


def renamed_attribute(module: str, name: str, renames: Mapping[str, str], scope: dict) -> Any:
    """A module ``__getattr__`` body: an old class name still imports, with a warning.

    Raises:
        AttributeError: `name` is neither an old name nor defined.
    """
    if name in renames:
        new = renames[name]
        warnings.warn(
            f"{module}.{name} was renamed {new}; the old name goes in litmt {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=3,
        )
        return scope[new]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


__all__ = [
    "REMOVED_IN",
    "build",
    "check_keys",
    "check_null",
    "command_line_keys",
    "default_of",
    "field_docs",
    "job_config",
    "nullable_fields",
    "plain",
    "renamed_attribute",
    "renamed_keys",
    "render_yaml",
    "yaml_comment",
    "yaml_comments",
    "yaml_scalar",
]
