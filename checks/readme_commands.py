"""Run every command of README.md's ```bash blocks and say, per command, what was done and
whether it worked: "every command in the README works", checkable by anyone.

Each command (``\\`` continuations joined, comments dropped, ``cmd1 && cmd2`` and pipelines
kept) runs under ``bash -o pipefail`` in a fresh temporary working directory laid out like the
repository (``conf/``, ``scripts/``, ``src/``, ``web/``, ... linked; ``data/`` and ``logs/``
its own), with a temporary HOME and XDG_CACHE_HOME, ``WANDB_MODE=offline`` and
``HF_HUB_OFFLINE=1``. A command that reads what an earlier command of its block writes
(``out=exports/en-de-int8`` then ``ckpt_path=exports/en-de-int8``; a server then its curl)
shares that command's directory. Placeholders become small files it writes itself:

- ``CKPT``: a tiny trained checkpoint (tests/helpers/tiny_checkpoint.py); ``A.ckpt``,
  ``B.ckpt``, ``C.ckpt``: copies of it;
- ``test.en``/``test.de``/``mono.de``/``requests.jsonl``, ``data/in_domain``, ``data/bt``:
  template sentences; ``spm/joint.model``: a sentencepiece model of the Multi30k corpus below;
- ``logs/<task>/runs/RUN``: a run directory holding five checkpoints;
- ``opus-mt-en-de``: a tiny random Marian model (what ``huggingface-cli download`` would fetch);
- ``../shared/data/multi30k``: that folder when it exists, else a tiny corpus in the same
  ``{split}.{lang}`` layout (en, de, fr, cs).

How each command is checked (the ``how`` column):

- ``ran``: run as written;
- ``ran capped``: training (``scripts/train.py``, ``student.py``, ``distill.py``) with the
  overrides of `TRAIN_CAPS` / `DISTILL_CAPS` appended (those the command does not set itself),
  so that it finishes in seconds on a CPU; a training command on the hub copy of Multi30k also
  gets ``data.dir=../shared/data/multi30k``;
- ``composed only``: a training command that needs what this machine lacks (a GPU, several
  processes or nodes: ``trainer=gpu``, ``attention=flash``, ``torchrun``, ``srun``) is composed
  with ``--cfg job --resolve`` (Hydra resolves the config, nothing trains);
- ``ran in the background``: ``scripts/serve.py`` on a free loopback port until ``/health``
  answers, the README's curl against it (``--fail-with-body``), then stopped;
  ``python -m http.server`` until ``GET /`` answers, then stopped;
- ``collected only``: ``python -m pytest ...`` with ``--collect-only`` (the suite itself is
  not run here);
- ``not run``: what needs the network (``pip install``, ``npm ci``, ``huggingface-cli
  download``), with the one-line reason and what was checked instead.

    python -m checks.readme_commands                 # every command: a markdown table
    python -m checks.readme_commands --list          # the extracted commands only
    python -m checks.readme_commands --only serve    # the matching commands (and those whose outputs they read)
    python -m checks.readme_commands --timeout 300 --keep   # seconds per command; keep the temp dirs

Run it from the repository root. It exits with 1 when any row FAILs (a README command that
no longer works, or a fixture this check could not build).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHARED_MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
MULTI30K = "../shared/data/multi30k"  # as the README spells it, relative to the working dir
LINKED = ("benchmarks", "checks", "conf", "docs", "pyproject.toml", "README.md", "reports",
          "scripts", "src", "tests", "web", "mkdocs.yml", "CHANGELOG.md", "LICENSE")  # fmt: skip
RUN_NAME = "2026-01-01_00-00-00"  # what RUN becomes: a run directory name as Hydra writes it
PLACEHOLDERS = {"CKPT": "tiny.ckpt", "RUN": RUN_NAME}  # CKPT: made absolute per workspace
GPU_KERNELS = {"flash", "xformers", "te"}  # attention backends that need CUDA
# appended to every training command that does not set the key itself: seconds on a CPU
TRAIN_CAPS = {
    "trainer.max_steps": "2",
    "trainer.max_epochs": "1",
    "trainer.limit_train_batches": "2",
    "trainer.val_check_interval": "1.0",
    "trainer.check_val_every_n_epoch": "1",
    "trainer.max_time": "00:00:05:00",
    "trainer.enable_progress_bar": "false",
    "trainer.enable_model_summary": "false",
    "model.d_model": "32",
    "model.n_heads": "2",
    "model.d_ff": "64",
    "model.n_encoder_layers": "1",
    "model.n_decoder_layers": "1",
    "data.limit": "200",
    "data.tokenizer.vocab_size": "200",
    "data.num_workers": "0",
}
DISTILL_CAPS = {"data.limit": "200"}  # the first 200 training pairs, distilled to the end
STUDENT_LISTS = ("teacher_overrides", "student_overrides", "distill_overrides")
TAIL_LINES = 3  # stderr lines in a FAIL cell (the details below the table show more)


@dataclass
class Command:
    """One README command: its text (continuations joined, trailing comment dropped), the
    index of its ```bash block and the README line it starts on."""

    text: str
    block: int
    line: int


@dataclass
class Part:
    """What was done with one ``&&`` part of a command, and how it went."""

    how: str
    result: str  # ok | FAIL | - (nothing to judge)
    seconds: float = 0.0
    detail: str = ""  # the output tail of a FAIL


@dataclass
class Row:
    """A table row: the command and its parts."""

    command: Command
    parts: list[Part] = field(default_factory=list)

    @property
    def result(self) -> str:
        results = [p.result for p in self.parts]
        return "FAIL" if "FAIL" in results else "ok" if "ok" in results else "-"


# --- extraction -------------------------------------------------------------------------


def _scan(text: str):
    """Yield (index, char, in_quotes, paren depth) of `text`, shell-quote aware."""
    quote, depth, escaped = "", 0, False
    for i, ch in enumerate(text):
        yield i, ch, bool(quote) or escaped, depth
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)


def strip_comment(line: str) -> str:
    """`line` without its trailing shell comment (a ``#`` outside quotes, after a blank)."""
    for i, ch, quoted, _ in _scan(line):
        if ch == "#" and not quoted and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def split_chain(command: str) -> list[str]:
    """The parts of ``a && b && c`` at the top level (not inside quotes or a subshell)."""
    parts, start = [], 0
    for i, ch, quoted, depth in _scan(command):
        if ch == "&" and not quoted and depth == 0 and command[i : i + 2] == "&&" and i >= start:
            parts.append(command[start:i].strip())
            start = i + 2
    return [p for p in [*parts, command[start:].strip()] if p]


def extract_commands(markdown: str) -> list[Command]:
    """Every command of the ```bash blocks of `markdown`: ``\\`` continuation lines joined,
    comment lines and trailing comments dropped, ``&&`` chains and pipelines kept whole."""
    commands: list[Command] = []
    in_block, lang, block, pending, start = False, "", -1, "", 0
    for n, raw in enumerate(markdown.splitlines(), 1):
        line = raw.strip()
        if line.startswith("```"):
            in_block, lang = not in_block, line[3:].strip() if not in_block else ""
            block += in_block and lang == "bash"
            continue
        if not in_block or lang != "bash":
            continue
        if not pending and (not line or line.startswith("#")):
            continue
        start = start if pending else n
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        text = strip_comment(pending + line).strip()
        pending = ""
        if text:
            commands.append(Command(text, block, start))
    return commands


def substitute(command: str, mapping: dict[str, str]) -> str:
    """`command` with each placeholder word of `mapping` (``CKPT``, ``RUN``) replaced; other
    words that contain it (``A.ckpt``, ``ckpt_path``, ``RUNS``) are left alone."""
    for word, value in mapping.items():
        command = re.sub(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", lambda _, v=value: v, command)
    return command


# --- what a command needs ---------------------------------------------------------------


def words(text: str, *, command: bool = True) -> list[str]:
    """The shell words of `text` (`shlex`, best effort); of a `command`, without its leading
    ``VAR=value`` assignments."""
    try:
        tokens = shlex.split(text)
    except ValueError:
        tokens = text.split()
    while command and tokens and re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]):
        tokens = tokens[1:]
    return tokens


def outputs(command: str) -> list[str]:
    """The paths a command writes that a later command may read (``out=``, ``output=``,
    ``--local-dir``)."""
    found = re.findall(r"(?:^|\s)(?:out|output)=(\S+)", command)
    return found + re.findall(r"--local-dir[ =](\S+)", command)


def mentions(command: str, path: str) -> bool:
    """Whether `path` appears in `command` as a whole path (not as a prefix of a longer one)."""
    return re.search(rf"(?<![\w./-]){re.escape(path)}(?![\w.-])", command) is not None


def needs(commands: list[Command]) -> dict[int, set[int]]:
    """For each command index, the earlier commands of its block whose outputs it reads (a
    curl: the server started before it)."""
    found: dict[int, set[int]] = {i: set() for i in range(len(commands))}
    for i, cmd in enumerate(commands):
        earlier = [j for j in range(i) if commands[j].block == cmd.block]
        for j in earlier:
            if any(mentions(cmd.text, p) for p in outputs(commands[j].text)):
                found[i].add(j)
        if words(cmd.text)[:1] == ["curl"]:
            servers = [j for j in earlier if "scripts/serve.py" in commands[j].text]
            found[i].update(servers[-1:])
    return found


def groups(commands: list[Command], selected: set[int]) -> list[list[int]]:
    """`selected` and the commands they read from, as groups that share a working directory
    (connected by `needs`), in README order."""
    deps = needs(commands)
    todo, chosen = list(selected), set(selected)
    while todo:
        for j in deps[todo.pop()] - chosen:
            chosen.add(j)
            todo.append(j)
    parent = {i: i for i in chosen}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in chosen:
        for j in deps[i] & chosen:
            parent[root(i)] = root(j)
    out: dict[int, list[int]] = {}
    for i in sorted(chosen):
        out.setdefault(root(i), []).append(i)
    return sorted(out.values())


# --- the workspace ------------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def tiny_multi30k(root: Path) -> Path:
    """A Multi30k stand-in: ``{train,valid,test2016}.{en,de,fr,cs}`` of template sentences."""
    from tiny_checkpoint import corpus

    en, de = corpus(seed=3)
    sizes = {"train": (0, 400), "valid": (400, 440), "test2016": (440, 480)}
    for split, (a, b) in sizes.items():
        write_lines(root / f"{split}.en", en[a:b])
        write_lines(root / f"{split}.de", de[a:b])
        write_lines(root / f"{split}.fr", [s.replace("Ein ", "Un ") for s in de[a:b]])
        write_lines(root / f"{split}.cs", [s.replace("Ein ", "Jeden ") for s in de[a:b]])
    return root


def build_fixtures(root: Path) -> Path:
    """Write every placeholder file once into ``root/fixtures`` (copied into each working
    directory) and ``root/shared/data/multi30k``; returns the fixtures directory."""
    sys.path[:0] = [str(REPO), str(REPO / "tests" / "helpers")]
    from tiny_checkpoint import build_tiny_checkpoint, corpus

    from benchmarks.hf_models import make_marian_dir
    from litmt.data.tokenization.tokenizer import TokenizerConfig, train_spm

    multi30k = root / "shared" / "data" / "multi30k"
    multi30k.parent.mkdir(parents=True)
    if SHARED_MULTI30K.is_dir():
        multi30k.symlink_to(SHARED_MULTI30K, target_is_directory=True)
    else:
        tiny_multi30k(multi30k)
    fix = root / "fixtures"
    ckpt = build_tiny_checkpoint(fix, max_positions=512)
    for name in ("A.ckpt", "B.ckpt", "C.ckpt"):
        shutil.copy(ckpt, fix / name)
    en, de = corpus(seed=1)
    write_lines(fix / "test.en", en[:20])
    write_lines(fix / "test.de", de[:20])
    write_lines(fix / "mono.de", de[20:30])
    requests = [{"src": "An old dog sleeps.", "prefix": "Ein alter", "constraints": ["Hund"]},
                {"src": en[30]}, {"src": en[31], "constraints": ["Mann"]}]  # fmt: skip
    write_lines(fix / "requests.jsonl", [json.dumps(r, ensure_ascii=False) for r in requests])
    for split, (a, b) in {"train": (0, 300), "valid": (300, 330), "test": (330, 360)}.items():
        write_lines(fix / "data" / "in_domain" / f"{split}.en", en[a:b])
        write_lines(fix / "data" / "in_domain" / f"{split}.de", de[a:b])
    write_lines(fix / "data" / "bt" / "train.en", en[360:420])
    write_lines(fix / "data" / "bt" / "train.de", de[360:420])
    sample = []
    for lang in ("en", "de"):
        sample += (multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:300]
    (fix / "spm").mkdir()
    model = train_spm(sample, TokenizerConfig(vocab_size=200, model_type="unigram"))
    (fix / "spm" / "joint.model").write_bytes(model)
    run = fix / "logs" / "multi30k_cpu" / "runs" / RUN_NAME / "checkpoints"
    run.mkdir(parents=True)
    for step in range(1, 6):
        shutil.copy(ckpt, run / f"best-step{step:06d}-bleu0.00.ckpt")
    shutil.copy(ckpt, run / "last.ckpt")
    make_marian_dir(fix / "opus-mt-en-de")
    # what the README's download writes: data/multi30k in the {split}.{lang} layout
    (fix / "data" / "multi30k").symlink_to(multi30k.resolve(), target_is_directory=True)
    return fix


def workspace(root: Path, fixtures: Path, name: str) -> Path:
    """A fresh working directory ``root/name`` laid out like the repository: its code and
    configs linked, the fixtures copied, ``../shared/data/multi30k`` beside it."""
    work = root / name
    shutil.copytree(fixtures, work, symlinks=True)
    for entry in LINKED:
        if (REPO / entry).exists():
            (work / entry).symlink_to(REPO / entry)
    (work / ".home" / ".cache").mkdir(parents=True)
    return work


def child_env(work: Path) -> dict[str, str]:
    """The commands' environment: offline, a temporary HOME, this interpreter as `python`."""
    home = work / ".home"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "PATH": path}  # fmt: skip


# --- running ------------------------------------------------------------------------------


def tail(text: str, n: int) -> str:
    """The last `n` non-blank lines of `text`."""
    return "\n".join([ln for ln in text.splitlines() if ln.strip()][-n:])


def run_shell(cmd: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """``bash -o pipefail -c cmd``: (status, stdout, stderr); status 124 on a timeout."""
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return 124, out, err + f"\ntimed out after {timeout:.0f} s"
    except BaseException:  # interrupted: take the command's whole process group down with us
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def judged(how: str, status: int, out: str, err: str, seconds: float) -> Part:
    """A `Part` for a finished command: ok on status 0, else FAIL with its output's tail."""
    if status == 0:
        return Part(how, "ok", seconds)
    return Part(how, "FAIL", seconds, tail(err, 15) or tail(out, 15) or f"exit status {status}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@dataclass
class Background:
    """A server started by a command: stopped when its working directory's commands are done."""

    proc: subprocess.Popen
    port: int
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_background(
    cmd: str, work: Path, env: dict[str, str], url: str, timeout: float, name: str
) -> tuple[Background, bool, str]:
    """Start `cmd` in the background and wait until `url` answers 200: (server, up, log tail)."""
    log = work / f".{name}.log"
    with log.open("w") as f:
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=work, env=env,
                                stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    server, deadline = Background(proc, 0, log), time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if http_ok(url):
            return server, True, ""
        time.sleep(0.5)
    up = proc.poll() is None and http_ok(url)
    why = "" if up else "exited" if proc.poll() is not None else f"no answer in {timeout:.0f} s"
    return server, up, f"{url}: {why}\n" + tail(log.read_text(errors="replace"), 15)


# --- requirements (pip install) ---------------------------------------------------------


def missing_requirements(extras: set[str]) -> list[str]:
    """The requirements of the installed ``litmt[extras]`` (extras of extras included) that
    are absent or at a version outside their specifier."""
    from importlib import metadata

    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in metadata.requires("litmt") or []]
    todo, seen, missing = {"", *extras}, set(), []
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for req in reqs:
            applies = not extra if req.marker is None else req.marker.evaluate({"extra": extra})
            if not applies:
                continue
            if req.name == "litmt":
                todo |= set(req.extras) - seen
                continue
            try:
                version = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                missing.append(str(req))
                continue
            if not req.specifier.contains(version, prereleases=True):
                missing.append(f"{req} (found {version})")
    return sorted(set(missing))


def check_pip(step: str) -> Part:
    """``pip install -e .[extras]``: not run (network); checks litmt is installed from this
    tree with the requirements of those extras. ``pip install torch ...``: checks torch is
    installed."""
    from importlib import metadata

    if "-e" not in words(step) and "torch" in words(step):
        how = "not run: needs the network; checked instead that torch is installed"
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return Part(how, "FAIL", detail="torch is not installed")
        return Part(how, "ok", detail=f"torch {version}")
    extras = set(",".join(re.findall(r"\.\[([\w,-]+)\]", step)).split(",")) - {""}
    import litmt

    label = f"litmt[{','.join(sorted(extras))}]" if extras else "litmt"
    how = f"not run: needs the network; checked instead that {label} is installed"
    if REPO / "src" not in Path(litmt.__file__).resolve().parents:
        return Part(how, "FAIL", detail=f"litmt is imported from {litmt.__file__}, not {REPO}")
    missing = missing_requirements(extras)
    return (
        Part(how, "FAIL", detail="missing: " + ", ".join(missing)) if missing else Part(how, "ok")
    )


# --- training commands ------------------------------------------------------------------


def script_args(step: str, script: str) -> str:
    """The raw text after ``scripts/<script>`` in `step` (its overrides, quoting kept)."""
    return step.split(f"scripts/{script}", 1)[1].strip()


def user_keys(args: str) -> set[str]:
    """The config keys an override string sets (``+key=v``, ``key=v``)."""
    return {
        t.split("=", 1)[0].lstrip("+~")
        for t in words(args, command=False)
        if "=" in t and t[0] != "-"
    }


def caps_for(args: str, caps: dict[str, str]) -> list[str]:
    """The ``key=value`` overrides of `caps` whose key `args` does not set."""
    keys = user_keys(args)
    return [f"{k}={v}" for k, v in caps.items() if k not in keys]


def compose_args(args: str) -> str:
    """`args` for ``--cfg job``: a multirun's ``-m`` dropped and each sweep cut to its first
    value (``attention=math,sdpa`` -> ``attention=math``)."""
    out = []
    for tok in words(args, command=False):
        if tok in ("-m", "--multirun"):
            continue
        key, eq, value = tok.partition("=")
        if eq and "," in value and value[:1] not in "[{'\"":
            value = value.split(",", 1)[0]
        out.append(shlex.quote(f"{key}{eq}{value}"))
    return " ".join(out)


def compose(args: str, work: Path, env: dict[str, str], timeout: float) -> tuple[Part, dict]:
    """``python scripts/train.py ARGS --cfg job --resolve``: (its part, the config)."""
    t0 = time.monotonic()
    cmd = f"python scripts/train.py {compose_args(args)} --cfg job --resolve"
    status, out, err = run_shell(cmd, work, env, timeout)
    part = judged("composed only", status, out, err, time.monotonic() - t0)
    if status != 0:
        return part, {}
    import yaml

    return part, yaml.safe_load(out) or {}


def lacks(cfg: dict[str, Any], launcher: list[str]) -> str:
    """Why this machine cannot train config `cfg` (started by `launcher`), or ''."""
    trainer, model = cfg.get("trainer") or {}, cfg.get("model") or {}
    kernels = {v for k, v in (model.get("attention") or {}).items() if not k.endswith("_options")}
    gpus = int(trainer.get("devices") or 1) * int(trainer.get("num_nodes") or 1)
    reasons = []
    if launcher:
        flags = " ".join(t for t in launcher[1:] if t.startswith("--n"))
        reasons.append(f"several processes/nodes ({launcher[0]} {flags})".replace(" )", ")"))
    if trainer.get("accelerator") == "gpu":
        have = 0
        try:
            import torch

            have = torch.cuda.device_count()
        except ImportError:
            pass
        if have < gpus or launcher:
            reasons.append(f"{gpus} GPU(s) (trainer.accelerator=gpu; this machine has {have})")
    if kernels & GPU_KERNELS:
        reasons.append(f"a CUDA attention kernel ({', '.join(sorted(kernels & GPU_KERNELS))})")
    return "needs " + " and ".join(reasons) if reasons else ""


def run_train(step: str, work: Path, env: dict[str, str], timeout: float) -> list[Part]:
    """A ``scripts/train.py`` command: composed first; run capped when this machine can."""
    tokens = words(step)
    launcher = tokens[: tokens.index("scripts/train.py")] if tokens[0] != "python" else []
    args = script_args(step, "train.py")
    part, cfg = compose(args, work, env, timeout)
    if part.result == "FAIL":
        return [part]
    reason = lacks(cfg, launcher)
    data = cfg.get("data") or {}
    extra: list[str] = []
    if not reason and not data.get("dir"):
        if data.get("name") == "multi30k":
            extra = [f"data.dir={MULTI30K}"]
        else:
            reason = f"needs the network (the hub dataset {(data.get('hub') or {}).get('path')})"
    if reason:
        part.how = f"composed only: {reason}"
        return [part]
    caps = extra + caps_for(args, TRAIN_CAPS)
    note = " (+data.dir: the command reads the hub copy of Multi30k)" if extra else ""
    prefix = step if not launcher else f"python scripts/train.py {args}"
    t0 = time.monotonic()
    status, out, err = run_shell(f"{prefix} {' '.join(caps)}", work, env, timeout)
    return [judged(f"ran capped{note}", status, out, err, time.monotonic() - t0)]


def hydra_list(items: list[str]) -> str:
    return shlex.quote("[" + ", ".join(json.dumps(i) for i in items) + "]")


def run_capped(step: str, script: str, work: Path, env: dict[str, str], timeout: float) -> Part:
    """``student.py`` (capped teacher, distillation and student) or ``distill.py`` (capped)."""
    args = script_args(step, script)
    if script == "student.py":
        train = [f"{k}={v}" for k, v in TRAIN_CAPS.items()]
        lists = {"teacher_overrides": train, "student_overrides": train,
                 "distill_overrides": [f"{k}={v}" for k, v in DISTILL_CAPS.items()]}  # fmt: skip
        caps = [f"{k}={hydra_list(v)}" for k, v in lists.items() if k not in user_keys(args)]
    else:
        caps = caps_for(args, DISTILL_CAPS)
    t0 = time.monotonic()
    status, out, err = run_shell(f"{step} {' '.join(caps)}", work, env, timeout)
    return judged("ran capped", status, out, err, time.monotonic() - t0)


# --- one command --------------------------------------------------------------------------


@dataclass
class Context:
    """A working directory shared by a group of commands, and the servers they started."""

    work: Path
    env: dict[str, str]
    timeout: float
    servers: list[Background] = field(default_factory=list)


def run_step(step: str, ctx: Context) -> list[Part]:
    """Check one ``&&`` part of a command (placeholders already replaced)."""
    tokens = words(step)
    program = tokens[0] if tokens else ""
    t0 = time.monotonic()
    if program == "pip":
        return [check_pip(step)]
    if "pytest" in tokens[:3] and "-m" in tokens[:2]:
        cmd = f"{step} --collect-only -q -p no:cacheprovider"
        status, out, err = run_shell(cmd, REPO, ctx.env, ctx.timeout)
        how = "collected only: the suite itself is not run here (--collect-only, in the repo root)"
        return [judged(how, status, out, err, time.monotonic() - t0)]
    if "npm" in tokens:
        have = (REPO / "web" / "node_modules").is_dir()
        how = "not run: needs the network (the npm registry); checked that web/node_modules exists"
        return [
            Part(how, "ok" if have else "FAIL", detail="" if have else "web/node_modules is absent")
        ]
    if program == "for" and "curl" in tokens and re.search(r"https://(?!localhost)", step):
        how = (
            "not run: needs the network (the download); data/multi30k, a link to the "
            "shared Multi30k copy (or a tiny corpus in its layout), stands in for its output"
        )
        return [Part(how, "-")]
    if tokens[:2] == ["mkdocs", "serve"]:
        port = free_port()
        cmd = f"{step} --dev-addr 127.0.0.1:{port}"
        server, up, why = start_background(cmd, ctx.work, ctx.env,
                                           f"http://127.0.0.1:{port}/", 180, "mkdocs")  # fmt: skip
        server.stop()
        how = f"ran in the background on port {port} until GET / answered 200, then stopped"
        return [Part(how, "ok" if up else "FAIL", time.monotonic() - t0, "" if up else why)]
    if program in ("huggingface-cli", "hf") and "download" in tokens:
        how = "not run: needs the network (the hub); a tiny random Marian model stands in for its output"
        return [Part(how, "-")]
    if "scripts/train.py" in tokens:
        return run_train(step, ctx.work, ctx.env, ctx.timeout)
    if "scripts/student.py" in tokens or "scripts/distill.py" in tokens:
        script = "student.py" if "scripts/student.py" in tokens else "distill.py"
        return [run_capped(step, script, ctx.work, ctx.env, ctx.timeout)]
    if "scripts/serve.py" in tokens:
        port = free_port()
        cmd = re.sub(r"\bport=\d+", f"port={port}", step)
        cmd += "" if f"port={port}" in cmd else f" port={port}"
        server, up, why = start_background(cmd, ctx.work, ctx.env,
                                           f"http://127.0.0.1:{port}/health", 180, "serve")  # fmt: skip
        server.port = port
        ctx.servers.append(server)
        how = f"ran in the background on 127.0.0.1:{port} until /health answered, then stopped"
        return [Part(how, "ok" if up else "FAIL", time.monotonic() - t0, "" if up else why)]
    if "http.server" in tokens:
        port = free_port()
        cmd = re.sub(r"\s\d{2,5}$", f" {port}", step)
        cmd += "" if cmd.endswith(f" {port}") else f" {port}"
        server, up, why = start_background(cmd, ctx.work, ctx.env,
                                           f"http://127.0.0.1:{port}/", 60, "http")  # fmt: skip
        server.stop()
        how = f"ran in the background on port {port} until GET / answered 200, then stopped"
        return [Part(how, "ok" if up else "FAIL", time.monotonic() - t0, "" if up else why)]
    if program == "curl":
        live = [s for s in ctx.servers if s.proc.poll() is None]
        if not live:
            return [Part("not run: no server of this README block is running", "FAIL")]
        port = live[-1].port
        cmd = re.sub(r"(localhost|127\.0\.0\.1):\d+", rf"\g<1>:{port}", step)
        cmd = cmd.replace("curl ", "curl --fail-with-body ", 1)
        status, out, err = run_shell(cmd, ctx.work, ctx.env, ctx.timeout)
        how = f"ran against the server above (port {port}, + --fail-with-body)"
        return [judged(how, status, out, err, time.monotonic() - t0)]
    status, out, err = run_shell(step, ctx.work, ctx.env, ctx.timeout)
    return [judged("ran", status, out, err, time.monotonic() - t0)]


def run_command(cmd: Command, ctx: Context) -> Row:
    """Check every ``&&`` part of `cmd` in order, stopping at the first FAIL (as ``&&`` does)."""
    mapping = {**PLACEHOLDERS, "CKPT": str(ctx.work / PLACEHOLDERS["CKPT"])}
    row = Row(cmd)
    for step in split_chain(substitute(cmd.text, mapping)):
        row.parts += run_step(step, ctx)
        if row.result == "FAIL":
            break
    return row


def run_all(commands: list[Command], selected: set[int], timeout: float, root: Path) -> list[Row]:
    """Build the fixtures, then run each group of `selected` in its own fresh directory."""
    rows: dict[int, Row] = {}
    try:
        fixtures = build_fixtures(root)
    except Exception as exc:  # reported as a FAIL row, not a traceback
        fake = Command("(fixtures: tiny checkpoint, corpora, Marian model)", -1, 0)
        return [Row(fake, [Part("ran", "FAIL", detail=f"{type(exc).__name__}: {exc}")])]
    for group in groups(commands, selected):
        work = workspace(root, fixtures, f"cmd{group[0]:02d}")
        ctx = Context(work, child_env(work), timeout)
        try:
            for i in group:
                rows[i] = run_command(commands[i], ctx)
                print(f"[{i:02d}] {rows[i].result:4} {commands[i].text[:100]}", file=sys.stderr)
        finally:
            for server in ctx.servers:
                server.stop()
    return [rows[i] for i in sorted(rows)]


# --- the table ----------------------------------------------------------------------------


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ⏎ ")


def table(rows: list[Row]) -> str:
    """The markdown table: command, how, result, seconds (a FAIL with its last lines)."""
    lines = ["| command | how | result | seconds |", "|---|---|---|---:|"]
    for row in rows:
        how = "; then ".join(p.how for p in row.parts)
        result = row.result
        if result == "FAIL":
            detail = next(p.detail for p in row.parts if p.result == "FAIL")
            result = f"FAIL: {tail(detail, TAIL_LINES)}"
        seconds = sum(p.seconds for p in row.parts)
        lines.append(
            f"| `{cell(row.command.text)}` | {cell(how)} | {cell(result)} | {seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", metavar="SUBSTRING", help="run the commands that contain it")
    p.add_argument("--list", action="store_true", help="print the extracted commands and exit")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per command (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directories")
    p.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    commands = extract_commands(args.readme.read_text(encoding="utf-8"))
    if args.list:
        for i, cmd in enumerate(commands):
            print(f"[{i:02d}] README:{cmd.line} block {cmd.block}: {cmd.text}")
        return 0
    selected = {i for i, c in enumerate(commands) if args.only is None or args.only in c.text}
    if not selected:
        print(f"no README command contains {args.only!r}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the commands and servers too
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="readme_commands_"))
    try:
        rows = run_all(commands, selected, args.timeout, root)
    finally:
        if args.keep:
            print(f"kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    caps = " ".join(f"{k}={v}" for k, v in TRAIN_CAPS.items())
    print(f"\nran capped = these overrides appended unless the command sets the key: {caps}; "
          f"distill.py: {' '.join(f'{k}={v}' for k, v in DISTILL_CAPS.items())}; student.py: "
          f"the training ones as teacher_overrides and student_overrides, distill's as "
          f"distill_overrides.")  # fmt: skip
    failed = [r for r in rows if r.result == "FAIL"]
    for row in failed:
        detail = next(p.detail for p in row.parts if p.result == "FAIL")
        print(f"\nFAIL README:{row.command.line} `{row.command.text}`\n{detail}")
    total = time.monotonic() - t0
    print(f"\n{len(rows)} commands, {len(failed)} FAIL, {total:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
