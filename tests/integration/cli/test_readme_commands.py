"""checks/readme_commands.py: the extraction of README commands (fast) and the whole check,
every README command run, capped, composed or reported with its reason (slow: minutes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from train_utils import REPO, script_env

from checks.readme_commands import extract_commands, needs, split_chain, substitute

MARKDOWN = """\
# Title

```bash
pip install -e . && python scripts/train.py   # install, train
# a comment line
python scripts/train.py trainer=ddp \\
    trainer.devices=8 'data.extra_train=[{name: bt, tag: "<#BT>"}]'
echo "a # b" | python scripts/translate.py ckpt_path=CKPT
```

```python
print("not a command")
```

```bash
python scripts/export.py ckpt_path=CKPT out=exports/x
python scripts/serve.py ckpt_path=exports/x port=5000
curl -s localhost:5000/translate -d '{"q": "A"}'
python scripts/average_checkpoints.py run_dir=logs/t/runs/RUN output=A.ckpt
```
"""


def test_extraction_joins_continuations_skips_comments_keeps_chains() -> None:
    commands = extract_commands(MARKDOWN)
    assert [c.text for c in commands] == [
        "pip install -e . && python scripts/train.py",
        "python scripts/train.py trainer=ddp trainer.devices=8 "
        "'data.extra_train=[{name: bt, tag: \"<#BT>\"}]'",
        'echo "a # b" | python scripts/translate.py ckpt_path=CKPT',
        "python scripts/export.py ckpt_path=CKPT out=exports/x",
        "python scripts/serve.py ckpt_path=exports/x port=5000",
        'curl -s localhost:5000/translate -d \'{"q": "A"}\'',
        "python scripts/average_checkpoints.py run_dir=logs/t/runs/RUN output=A.ckpt",
    ]
    assert [c.block for c in commands] == [0, 0, 0, 1, 1, 1, 1]
    assert [c.line for c in commands] == [4, 6, 8, 16, 17, 18, 19]
    assert split_chain(commands[0].text) == ["pip install -e .", "python scripts/train.py"]
    assert split_chain("(cd web && npm ci) && echo 'a && b'") == [
        "(cd web && npm ci)",
        "echo 'a && b'",
    ]
    # the server reads the export; the curl needs the server
    assert needs(commands)[4] == {3} and needs(commands)[5] == {4} and needs(commands)[6] == set()


def test_placeholders_are_replaced_as_whole_words_only() -> None:
    mapping = {"CKPT": "/tmp/w/tiny.ckpt", "RUN": "2026-01-01_00-00-00"}
    cmd = "x.py ckpt_path=CKPT 'ckpt_path=[A.ckpt,B.ckpt]' run_dir=logs/t/runs/RUN CKPTS RUNS"
    assert substitute(cmd, mapping) == (
        "x.py ckpt_path=/tmp/w/tiny.ckpt 'ckpt_path=[A.ckpt,B.ckpt]' "
        "run_dir=logs/t/runs/2026-01-01_00-00-00 CKPTS RUNS"
    )


@pytest.mark.slow
def test_every_readme_command_works() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "checks.readme_commands"],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
