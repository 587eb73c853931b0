"""The ONNX path through the real scripts: ``export.py format=onnx``, then ``translate.py`` and
``evaluate.py`` with ``engine=onnx`` on the export, against the torch engine's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_checkpoint import corpus

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from litmt import Translator

REPO = Path(__file__).resolve().parents[3]


def _run(script: str, *overrides: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *overrides],
        input=stdin, capture_output=True, env=env, timeout=300,
    )  # fmt: skip


def test_export_then_translate_and_evaluate(ckpt, tmp_path):
    out = tmp_path / "onnx"
    proc = _run("export.py", f"ckpt_path={ckpt}", f"out={out}", "format=onnx")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == str(out)  # the job's one line of data
    assert {"encoder.onnx", "decoder.onnx", "config.json", "src.model"} <= {
        p.name for p in out.iterdir()
    }
    en, de = corpus(seed=2)
    src = en[:12]
    proc = _run(
        "translate.py", f"ckpt_path={out}", "engine=onnx", "threads=1", "beam_size=3",
        stdin="\n".join(src).encode() + b"\n",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    got = proc.stdout.decode().splitlines()
    # the tiny model decides these 12 sentences by margins far above NEAR_TIE (its parity
    # test, tests/unit/deploy/export/test_onnx_export.py, allows near-ties): equality here
    assert got == Translator.from_checkpoint(ckpt, device="cpu").translate(src, beam_size=3)
    (tmp_path / "src.en").write_text("\n".join(src) + "\n")
    (tmp_path / "ref.de").write_text("\n".join(de[:12]) + "\n")
    proc = _run(
        "evaluate.py", f"ckpt_path={out}", "engine=onnx", f"src_file={tmp_path / 'src.en'}",
        f"ref_file={tmp_path / 'ref.de'}", f"hyp_file={tmp_path / 'hyp.de'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "hyp.de").read_text().splitlines() == Translator.from_checkpoint(
        ckpt, device="cpu"
    ).translate(src)


def test_export_refusal_is_one_line(ckpt, tmp_path):
    proc = _run("export.py", f"ckpt_path={ckpt}", f"out={tmp_path / 'x'}", "format=onnx",
                "quantization=float16")  # fmt: skip
    assert proc.returncode != 0
    err = proc.stderr.decode().strip().splitlines()
    assert err[-1].endswith("format=onnx supports quantization none | int8, not 'float16'")
    assert "Traceback" not in proc.stderr.decode()


def test_onnx_export_is_served_on_onnx_without_attention(ckpt, tmp_path):
    """An ONNX export given to the server runs on engine=onnx (whatever engine= says), its
    /health says so, /translate answers as the torch engine, /attention is not served."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import httpx
    from server_thread import ServerThread

    from litmt.deploy.export.onnx import export_onnx
    from litmt.deploy.server.app import ServeConfig, build_server_app

    out = export_onnx(ckpt, tmp_path / "onnx")
    app = build_server_app(out, engine="torch", settings=ServeConfig(), threads=1)
    sentences = corpus(seed=4)[0][:4]
    reference = Translator.from_checkpoint(ckpt, device="cpu").translate(sentences)
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        assert c.get("/health").json()["engine"] == "onnx"
        r = c.post("/translate", json={"q": sentences, "source": "en", "target": "de"})
        assert r.json() == {"translatedText": reference}
        assert c.post("/attention", json={"q": sentences[0]}).status_code == 501
