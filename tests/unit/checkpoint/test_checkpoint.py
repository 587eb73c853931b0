"""Checkpoints: safe loading (weights_only, malicious pickles refused), atomic saves that
survive a kill, one-line errors for missing/empty/truncated/corrupt files, and refusal of a
checkpoint made for another model config, tokenizer or language pair."""

from __future__ import annotations

import os
import shlex
import signal
import string
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import tiny_checkpoint
import torch
from tiny_checkpoint import corpus

from litmt.checkpoint.compat import check_compatible, tokenizer_difference
from litmt.checkpoint.io import (
    META_KEY,
    atomic_save,
    load_checkpoint,
    model_state_dict,
    save_model_checkpoint,
)
from litmt.checkpoint.load import load_model, resolve_device
from litmt.checkpoint.paths import checkpoint_paths
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig
from litmt.errors import BackendError, CheckpointError, ConfigError
from litmt.models import Seq2SeqTransformer, TransformerConfig

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    en, de = corpus()
    return Tokenizer.train(en, de, TokenizerConfig(vocab_size=80))


# Smaller than the tiny translator: these models are only saved and loaded.
SMALL = {"d_model": 32, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1}


def tiny_config(tokenizer: Tokenizer, **kw: object) -> TransformerConfig:
    return tiny_checkpoint.tiny_config(
        tokenizer.src_vocab_size, **{**SMALL, "max_positions": 32, **kw}
    )


def save_tiny(path: Path, tokenizer: Tokenizer, **kw: object) -> Path:
    model = Seq2SeqTransformer(tiny_config(tokenizer, **kw))
    return save_model_checkpoint(path, model, tokenizer, "en", "de")


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


class Evil:
    """Unpickling this runs a shell command: the classic malicious-checkpoint payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def plant_malicious(path: Path, marker: Path) -> Path:
    torch.save({"state_dict": {"model.w": torch.zeros(2)}, META_KEY: Evil(marker)}, path)
    return path


# -- safe loading ------------------------------------------------------------------------


def test_checkpoint_holds_only_plain_types_and_round_trips(tmp_path, tokenizer):
    path = save_tiny(tmp_path / "a.ckpt", tokenizer)
    raw = torch.load(path, weights_only=True)  # plain torch, no litmt code involved
    meta = raw[META_KEY]
    assert isinstance(meta["model_config"], dict) and isinstance(
        meta["tokenizer"]["src_model"], bytes
    )
    loaded = load_model(path)
    for k, v in model_state_dict(raw).items():
        assert torch.equal(loaded.model.state_dict()[k], v)
    assert loaded.tokenizer.to_dict() == tokenizer.to_dict()


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"
    evil = plant_malicious(tmp_path / "evil.ckpt", marker)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(evil)
    assert one_line(exc).startswith(f"refusing to load {evil}: it contains pickled objects")
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="refusing to load"):
        load_model(evil)
    assert not marker.exists()
    # control: the planted payload is real (an unsafe load runs it)
    torch.load(evil, weights_only=False)
    assert marker.exists()


@pytest.mark.slow
def test_translate_script_refuses_a_malicious_checkpoint_in_one_line(tmp_path):
    marker = tmp_path / "PWNED"
    evil = plant_malicious(tmp_path / "evil.ckpt", marker)
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "translate.py"), f"ckpt_path={evil}"],
        input=b"A dog runs.\n",
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr.decode()
    err = proc.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: refusing to load {evil}: it contains")
    assert proc.stdout == b"" and not marker.exists()


def test_missing_empty_truncated_and_corrupt_files_give_one_line_errors(tmp_path, tokenizer):
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(tmp_path / "nope.ckpt")
    assert one_line(exc) == (
        f"checkpoint not found: {tmp_path / 'nope.ckpt'} (pass ckpt_path=<path to a .ckpt file>)"
    )
    empty = tmp_path / "empty.ckpt"
    empty.touch()
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(empty)
    assert one_line(exc) == f"checkpoint {empty} is empty (0 bytes); the save was interrupted"

    good = save_tiny(tmp_path / "good.ckpt", tokenizer)
    data = good.read_bytes()
    for name, content in [
        ("half.ckpt", data[: len(data) // 2]),
        ("tail.ckpt", data[:-200]),
        ("junk.ckpt", b"this is not a checkpoint"),
        ("flipped.ckpt", data[:100] + bytes(b ^ 0xFF for b in data[100:400]) + data[400:]),
    ]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(CheckpointError) as exc:
            load_checkpoint(bad)
        assert one_line(exc).startswith(f"checkpoint {bad} is truncated or corrupt (")
        assert one_line(exc).endswith(
            "use another checkpoint of the run (e.g. a best-*.ckpt) or retrain"
        )


def test_flipped_bits_inside_tensor_data_are_caught_by_the_checksum(tmp_path, tokenizer):
    good = save_tiny(tmp_path / "good.ckpt", tokenizer)
    with zipfile.ZipFile(good) as archive:
        tensors = [i for i in archive.infolist() if "/data/" in i.filename]  # tensor storages
        biggest = max(tensors, key=lambda i: i.compress_size)
    data = bytearray(good.read_bytes())
    head = biggest.header_offset  # local file header: 30 bytes + name + extra (alignment padding)
    start = head + 30 + int.from_bytes(data[head + 26 : head + 28], "little")
    start += int.from_bytes(data[head + 28 : head + 30], "little")
    for i in range(start + 8, start + 24):
        data[i] ^= 0x01  # bit rot inside one tensor's bytes
    bad = tmp_path / "bitrot.ckpt"
    bad.write_bytes(bytes(data))
    torch.load(bad, weights_only=True)  # torch alone loads it without complaint
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(bad)
    assert one_line(exc) == (
        f"checkpoint {bad} is corrupt (checksum mismatch in {biggest.filename}); "
        "use another checkpoint of the run (e.g. a best-*.ckpt) or retrain"
    )
    load_checkpoint(bad, verify=False)  # opt-out: no check


def test_files_that_are_not_litmt_checkpoints(tmp_path, tokenizer):
    cases = [
        ({"weights": torch.zeros(1)}, "is not a litmt checkpoint (no state_dict)"),
        ({"state_dict": {}}, "is not a litmt checkpoint (no 'litmt' metadata"),
        (
            {"state_dict": {}, META_KEY: {"format": 99}},
            "has checkpoint format 99, this litmt reads 1",
        ),
    ]
    for i, (obj, message) in enumerate(cases):
        path = tmp_path / f"{i}.ckpt"
        torch.save(obj, path)
        with pytest.raises(CheckpointError) as exc:
            load_checkpoint(path)
        assert message in one_line(exc)


# -- atomic saves ------------------------------------------------------------------------


def test_a_save_that_fails_halfway_keeps_the_previous_checkpoint(tmp_path, tokenizer, monkeypatch):
    path = save_tiny(tmp_path / "last.ckpt", tokenizer)
    before = path.read_bytes()
    real_save = torch.save

    def dies_halfway(obj, f, *a, **kw):
        f.write(b"PK\x03\x04 half a zip file")  # some bytes reach the disk first
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        save_tiny(path, tokenizer, d_model=64)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before
    load_model(path)  # still valid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left


KILL_CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from litmt.checkpoint.io import atomic_save

    real_fsync = os.fsync

    def fsync_then_hang(fd):  # the new file is fully written, not yet renamed into place
        real_fsync(fd)
        print("written", flush=True)
        time.sleep(600)

    os.fsync = fsync_then_hang
    atomic_save({"state_dict": {"w": torch.ones(1 << 20)}, "litmt": {"format": 1}}, sys.argv[1])
    """
)

KILL_EARLY_CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from litmt.checkpoint.io import atomic_save

    real_fdopen = os.fdopen


    class StallsHalfway:  # the file atomic_save writes: stalls once 1 MiB has reached the disk
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            n = self.f.write(data)
            self.n += n
            if self.n > 1 << 20:
                self.f.flush()
                print("partial", flush=True)
                time.sleep(600)
            return n

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)


    os.fdopen = lambda fd, mode="r", *a, **k: StallsHalfway(real_fdopen(fd, mode, *a, **k))
    big = {f"w{i}": torch.randn(1 << 16) for i in range(64)}  # 16 MiB
    atomic_save({"state_dict": big, "litmt": {"format": 1}}, sys.argv[1])
    """
)


@pytest.mark.parametrize(
    "moment", [pytest.param("before_rename", marks=pytest.mark.slow), "while_writing"]
)
def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(tmp_path, tokenizer, moment):
    path = save_tiny(tmp_path / "last.ckpt", tokenizer)
    before = path.read_bytes()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILL_CHILD if moment == "before_rename" else KILL_EARLY_CHILD,
            str(path),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().decode().strip()
        assert line == ("written" if moment == "before_rename" else "partial")
        (tmp,) = tmp_path.glob(".last.ckpt.*.tmp")  # the new checkpoint, (partly) written
        assert tmp.stat().st_size > 1 << 20
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL, "the save finished before the kill"
    assert path.read_bytes() == before
    load_model(path)  # the previous checkpoint is intact
    # a leftover temporary file is hidden and not a *.ckpt, so nothing picks it up
    assert [p.name for p in tmp_path.glob("*.ckpt")] == ["last.ckpt"]
    assert all(p.name.startswith(".last.ckpt.") for p in tmp_path.glob("*.tmp"))


def test_atomic_save_replaces_the_file_in_one_step(tmp_path):
    path = tmp_path / "sub" / "x.ckpt"
    atomic_save({"a": torch.ones(2)}, path)
    atomic_save({"a": torch.zeros(3)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["a"], torch.zeros(3))
    assert [p.name for p in path.parent.iterdir()] == ["x.ckpt"]


# -- a checkpoint for another model / tokenizer than requested (case 7) -----------------------


def test_check_compatible_accepts_the_same_run_and_runtime_only_changes(tmp_path, tokenizer):
    ckpt = load_checkpoint(save_tiny(tmp_path / "a.ckpt", tokenizer))
    config = tiny_config(tokenizer)
    check_compatible(ckpt, config, tokenizer, src_lang="en", tgt_lang="de")
    check_compatible(ckpt, config.to_dict(), tokenizer.to_dict())
    changed = tiny_config(tokenizer, dropout=0.3, attention={"encoder_self": "math"})
    check_compatible(ckpt, changed, tokenizer)  # dropout and kernels do not change the weights


def test_check_compatible_names_the_model_setting_that_differs(tmp_path, tokenizer):
    path = save_tiny(tmp_path / "a.ckpt", tokenizer)
    ckpt = load_checkpoint(path)
    with pytest.raises(CheckpointError) as exc:
        check_compatible(ckpt, tiny_config(tokenizer, d_model=64), tokenizer, path=path)
    assert one_line(exc) == (
        f"{path} was trained with another model config (model.d_model=32 in the checkpoint, "
        "64 requested); use the settings it was trained with, or start a new run in a new "
        "hydra.run.dir"
    )
    with pytest.raises(CheckpointError) as exc:
        check_compatible(
            ckpt, tiny_config(tokenizer, d_ff=16, n_encoder_layers=3, positional="rope"), tokenizer
        )
    assert "model.d_ff=64 in the checkpoint, 16 requested; model.n_encoder_layers=1" in one_line(
        exc
    )
    assert "and 1 more" in one_line(exc)


def test_check_compatible_names_the_tokenizer_and_languages_that_differ(tmp_path, tokenizer):
    path = save_tiny(tmp_path / "a.ckpt", tokenizer)
    ckpt = load_checkpoint(path)
    en, de = corpus()
    other = Tokenizer.train(en, de, TokenizerConfig(vocab_size=60))
    with pytest.raises(CheckpointError) as exc:
        check_compatible(ckpt, tiny_config(tokenizer), other, path=path)
    assert one_line(exc) == (
        f"{path} was trained with another tokenizer (source vocabulary of "
        f"{tokenizer.src_vocab_size} pieces in the checkpoint, {other.src_vocab_size} requested); "
        "use the settings it was trained with, or start a new run in a new hydra.run.dir "
        "(data.tokenizer.*)"
    )
    separate = Tokenizer.train(en, de, TokenizerConfig(vocab_size=80, joint=False))
    with pytest.raises(CheckpointError, match="a joint vocabulary in the checkpoint, a separate"):
        check_compatible(ckpt, tiny_config(tokenizer), separate, path=path)
    with pytest.raises(CheckpointError) as exc:
        check_compatible(
            ckpt, tiny_config(tokenizer), tokenizer, path=path, src_lang="de", tgt_lang="en"
        )
    assert one_line(exc).startswith(f"{path} translates en->de, this run de->en;")


def test_averaging_checkpoints_of_different_runs_is_refused(tmp_path, tokenizer):
    a = save_tiny(tmp_path / "a.ckpt", tokenizer)
    b = save_tiny(tmp_path / "b.ckpt", tokenizer, d_ff=128)
    with pytest.raises(CheckpointError) as exc:
        load_model([a, b])
    assert one_line(exc) == (
        f"{b} has another model config (model.d_ff=128 vs 64) than {a}; "
        "only checkpoints of one run can be averaged"
    )
    # Same vocabulary size (so the same model config), other pieces: trained on the corpus
    # with every lower-case ASCII letter shifted by one (a->b, ..., z->a), a one-to-one
    # relabelling that keeps the statistics, so the vocabulary has the same size but its
    # pieces spell other strings.
    shift = str.maketrans(string.ascii_lowercase, string.ascii_lowercase[1:] + "a")
    en, de = corpus()
    other_tok = Tokenizer.train(
        [s.translate(shift) for s in en],
        [s.translate(shift) for s in de],
        TokenizerConfig(vocab_size=80),
    )
    assert other_tok.src_vocab_size == tokenizer.src_vocab_size
    assert tokenizer_difference(tokenizer, other_tok) is not None
    c = save_model_checkpoint(
        tmp_path / "c.ckpt", Seq2SeqTransformer(tiny_config(tokenizer)), other_tok, "en", "de"
    )
    with pytest.raises(CheckpointError) as exc:
        load_model([a, c])
    assert one_line(exc) == (
        f"{c} has another tokenizer than {a}; only checkpoints of one run can be averaged"
    )


# -- the one checkpoint-path parser and model loader (translate, evaluate, visualize) ---------


def test_checkpoint_paths_parses_every_form_the_jobs_accept(tmp_path):
    from omegaconf import OmegaConf

    assert checkpoint_paths("a.ckpt") == ["a.ckpt"]
    assert checkpoint_paths(tmp_path / "a.ckpt") == [str(tmp_path / "a.ckpt")]
    listed = OmegaConf.create({"p": ["a.ckpt", "b.ckpt"]}).p  # a ListConfig, as Hydra gives
    assert checkpoint_paths(listed) == checkpoint_paths(["a.ckpt", "b.ckpt"]) == listed
    run = tmp_path / "run"
    run.mkdir()
    for step in (5, 15, 10):
        (run / f"epoch=0-step={step}.ckpt").write_bytes(b"x")
    assert checkpoint_paths(None, run_dir=run, average_last=2) == [
        str(run / "epoch=0-step=10.ckpt"),
        str(run / "epoch=0-step=15.ckpt"),
    ]
    for args, kw, message in [
        ((None,), {}, "no checkpoint given: pass ckpt_path=<.ckpt> (or a list), or run_dir="),
        (([],), {}, "no checkpoint given"),
        (("a.ckpt",), {"run_dir": run, "average_last": 2}, "give either ckpt_path=... or run_dir"),
        ((None,), {"average_last": 2}, "average_last=N needs run_dir=<the run's directory>"),
        ((None,), {"run_dir": tmp_path / "nope", "average_last": 1}, "is not a directory"),
    ]:
        with pytest.raises(ConfigError) as exc:
            checkpoint_paths(*args, **kw)
        assert message in one_line(exc)


@pytest.mark.parametrize(
    ("job", "config", "extra"),
    [
        ("litmt.cli.translate:translate", "translate", []),
        ("litmt.cli.evaluate:evaluate", "evaluate", []),
        ("litmt.cli.visualize:visualize", "visualize_attention", ['sentence="A dog."']),
    ],
)
def test_the_jobs_share_the_checkpoint_parser(tmp_path, tokenizer, job, config, extra):
    """translate, evaluate and the heatmaps take their checkpoints from `checkpoint_paths`:
    each refuses a bad combination with the same message, and each reaches a run directory."""
    import importlib

    from hydra import compose, initialize_config_dir

    module, name = job.split(":")
    run_job = getattr(importlib.import_module(module), name)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for overrides, message in [
            ([], "no checkpoint given: pass ckpt_path=<.ckpt> (or a list), or run_dir=DIR"),
            (["average_last=2"], "average_last=N needs run_dir=<the run's directory>"),
            (["ckpt_path=a.ckpt", "average_last=2"], "give either ckpt_path=... or run_dir"),
            ([f"run_dir={tmp_path}", "average_last=1"], f"average_last=1 but {tmp_path} holds 0"),
        ]:
            with pytest.raises(ConfigError) as exc:
                run_job(compose(config, overrides=[*overrides, *extra]))
            assert one_line(exc).startswith(message)


def test_load_model_resolves_the_device_and_checks_backends(tmp_path, tokenizer):
    path = save_tiny(tmp_path / "a.ckpt", tokenizer)
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("auto") == resolve_device(None)
    assert next(load_model(path, "cpu").model.parameters()).device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(
            ConfigError, match="device=cuda was asked for but CUDA is not available"
        ):
            load_model(path, "cuda")
    # a checkpoint trained with flash (a CUDA-only kernel): on CPU it is refused at load time,
    # for a missing package or for the device, with the kernel to pass instead
    raw = torch.load(path, weights_only=True)
    raw[META_KEY]["model_config"]["attention"]["encoder_self"] = "flash"
    flash = tmp_path / "flash.ckpt"
    torch.save(raw, flash)
    with pytest.raises(BackendError) as exc:
        load_model(flash, "cpu", check_backends=True)
    assert "'flash'" in one_line(exc)
    assert one_line(exc).endswith("; decode with an exact kernel: attention=sdpa")
    loaded = load_model(flash, "cpu", attention="math", check_backends=True)
    assert loaded.model.config.attention.encoder_self == "math"
