"""Preparation never hangs (issue 42 item 6): a tokenising worker that dies fails the run
with one line naming the cause, instead of leaving the parent waiting forever. Each case
runs in a subprocess with a timeout, so a regression fails the test rather than hanging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_corpora import TINY_TOKENIZER, write_text_corpus

from litmt.data.preparation.encoding import WORKER_DIED

TIMEOUT_S = 300  # each case ends in 10-70 s on 2 loaded cores; a hang meets this limit
# the parallel path needs at least 1000 pairs per process (`tokenize_to_cache`)
PAIRS = {"train": 2600, "valid": 20, "test": 20}

# What a user writes to try the DataModule: no `if __name__ == "__main__":` guard. Under
# `spawn` each worker re-runs this file and fails at start.
NO_GUARD = textwrap.dedent(
    """
    import sys
    from litmt.data import TranslationDataModule

    dm = TranslationDataModule(name="tiny", dir=sys.argv[1], cache_dir=sys.argv[2],
                               tokenizer={tokenizer!r}, num_proc=2, num_workers=0)
    dm.prepare_data()
    print("prepared")
    """
)

# A worker that dies in the middle of a split (os._exit: no exception, no cleanup), in the
# second of three chunks; `tokenize_to_cache` goes parallel when the size is unknown.
KILLED = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[3])  # spawned workers inherit sys.path: they find `killer`
    import killer
    from tiny_corpora import make_pairs
    from litmt.data.preparation import encoding as preprocess
    from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig

    if __name__ == "__main__":
        src, tgt = make_pairs(300)
        tok = Tokenizer.train(src, tgt, TokenizerConfig(**{tokenizer!r}))
        src[100] = "DIE"
        chunks = [(src[a : a + 100], tgt[a : a + 100]) for a in (0, 100, 200)]
        preprocess._encode_chunk = killer.encode_or_die  # pickled by reference to `killer`
        cache = Path(sys.argv[2])
        try:
            preprocess.tokenize_to_cache(chunks, tok, cache / "train", num_proc=2, total=None)
        finally:
            print(json.dumps(sorted(p.name for p in cache.iterdir())))
    """
)
KILLER = textwrap.dedent(
    """
    import os
    from litmt.data.preparation import encoding as preprocess

    def encode_or_die(src, tgt, dedup):
        if src[0] == "DIE":
            os._exit(3)
        return preprocess._encode_chunk(src, tgt, dedup)
    """
)


def _run(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "prepare.py"
    path.write_text(script.format(tokenizer=dict(TINY_TOKENIZER)))
    cmd = [sys.executable, str(path), str(tmp_path / "corpus"), str(tmp_path / "cache"), *args]
    repo = Path(__file__).resolve().parents[4]  # tiny_corpora imports benchmarks/
    search = [str(repo / "tests" / "helpers"), str(repo), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": os.pathsep.join(search)}  # fmt: skip
    # a hang raises subprocess.TimeoutExpired here (and kills the script)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


@pytest.mark.slow
def test_script_without_main_guard_fails_with_one_line(tmp_path: Path) -> None:
    write_text_corpus(tmp_path / "corpus", sizes=PAIRS)
    run = _run(NO_GUARD, tmp_path)
    assert run.returncode != 0 and "prepared" not in run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last == "litmt.errors.DataError: " + WORKER_DIED.format(procs=2)
    assert 'if __name__ == "__main__":' in last and "num_proc=1" in last
    # the cause shows in the worker's own traceback too
    assert "has finished its bootstrapping phase" in run.stderr


def test_worker_killed_mid_split_fails_and_leaves_no_cache(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "killer.py").write_text(KILLER)
    run = _run(KILLED, tmp_path, str(tmp_path))
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith(WORKER_DIED.format(procs=2))
    # neither a published train cache nor a temporary directory is left behind
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
