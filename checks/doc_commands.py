"""Every command the README and the guide show names things that exist: each
``python scripts/<name>.py ...`` in a ```bash block composes with Hydra exactly as the script
would (its short keys expanded the script's way, every config group option and every key
known, ``+key`` new ones excepted), each ``python -m <module>`` of benchmarks/, checks/ and
reports/ is a module of this repository, and each ``scripts/<file>`` exists. Nothing runs:
composing is a check of names, not of data or models (checks/readme_commands.py runs the
README's commands).

    python -m checks.doc_commands     # one line per problem; exit 1 if any
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from checks.problems import Problem, report
from checks.readme_commands import extract_commands, split_chain

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = re.compile(r"(?:^|\s|/)scripts/(?P<name>[\w-]+)\.(?P<ext>py|sh)\b")
MODULE = re.compile(r"python3? -m (?P<module>(?:benchmarks|checks|reports)\.[\w.]+)")
RUN_SCRIPT = re.compile(r'run_script\(\s*"(?P<config>\w+)"')
SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page of docs/ except the lab notebook (history)."""
    docs = [p for p in sorted((root / "docs").rglob("*.md")) if "notebook" not in p.parts]
    return [root / "README.md", *docs]


def script_overrides(step: str, name: str) -> list[str] | None:
    """The Hydra overrides after ``scripts/<name>.py`` in `step` (None: flags we do not
    compose, such as ``--help``). A multirun's sweeps keep their first value."""
    tail = step.split(f"scripts/{name}.py", 1)[1]
    try:
        tokens = shlex.split(tail, comments=True)
    except ValueError:
        return None
    args: list[str] = []
    for token in tokens:
        if token in SHELL_STOP or token.startswith((">", "2>")):
            break
        args.append(token)
    if any(a in ("--help", "-h", "--info") for a in args):
        return None
    multirun = "-m" in args or "--multirun" in args
    out = []
    for arg in args:
        if arg.startswith("-"):
            continue
        if multirun and "=" in arg and "[" not in arg:
            key, _, value = arg.partition("=")
            arg = f"{key}={value.split(',')[0]}"
        out.append(arg)
    return out


def compose_problem(config: str, overrides: list[str], conf: Path) -> str | None:
    """Why Hydra cannot compose ``conf/<config>.yaml`` with `overrides`, or None."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from litmt.cli.script.config_check import expand_short_overrides

    overrides = expand_short_overrides(overrides, config, conf)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf), version_base=None):
            compose(config, overrides=overrides, return_hydra_config=True)
    except Exception as exc:  # Hydra raises many types; each becomes one problem line
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        GlobalHydra.instance().clear()
    return None


def check_page(path: Path, root: Path = ROOT) -> list[Problem]:
    """Every problem of the commands of one page."""
    problems = []
    name = str(path.relative_to(root))
    configs = {}
    for cmd in extract_commands(path.read_text(encoding="utf-8")):
        where = f"{name}:{cmd.line}"
        for m in MODULE.finditer(cmd.text):
            module = root / Path(*m["module"].split("."))
            if not (module.with_suffix(".py").is_file() or (module / "__init__.py").is_file()):
                problems.append(Problem(where, f"python -m {m['module']}: no such module"))
        for step in split_chain(cmd.text):
            for m in SCRIPT.finditer(step):
                script = root / "scripts" / f"{m['name']}.{m['ext']}"
                if not script.is_file():
                    problems.append(Problem(where, f"scripts/{script.name} does not exist"))
                    continue
                if m["ext"] != "py":
                    continue
                if script not in configs:
                    found = RUN_SCRIPT.search(script.read_text(encoding="utf-8"))
                    configs[script] = found["config"] if found else None
                overrides = script_overrides(step, m["name"])
                if configs[script] is None or overrides is None:
                    continue
                why = compose_problem(configs[script], overrides, root / "conf")
                if why:
                    problems.append(Problem(where, f"scripts/{script.name} {why}"))
    return problems


def check_all(root: Path = ROOT) -> list[Problem]:
    """Every problem of README.md and docs/ (the lab notebook excepted)."""
    return [p for page in pages(root) for p in check_page(page, root)]


def main() -> int:
    """Print each problem; exit 1 if any."""
    return report(check_all())


if __name__ == "__main__":
    raise SystemExit(main())
