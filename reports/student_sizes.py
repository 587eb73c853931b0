"""The int8 CTranslate2 package size of candidate student shapes, before training any: each
shape is built with the real model class, its weights perturbed (trained weights are all
distinct; CTranslate2 stores equal variables once, so untrained LayerNorms and biases would
shrink the file) and exported with ``litmt.deploy.export.ct2.export_model``, the tokenizer
trained by litmt on the distilled corpus. No timing.

    python reports/student_sizes.py --teacher TEACHER.ckpt --corpus data/multi30k_kd

Prints one line per shape: parameters, model.bin bytes, package bytes and the share of the
teacher's package (the teacher's own shape, exported the same way, first).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from litmt.checkpoint.io import META_KEY, MODEL_PREFIX, atomic_save, load_checkpoint
from litmt.data.tokenization.tokenizer import Tokenizer, TokenizerConfig, train_spm
from litmt.deploy.export.ct2 import export_model
from litmt.models import Seq2SeqTransformer, TransformerConfig

# (d_model, d_ff, encoder layers, decoder layers, vocabulary, max_positions); vocabulary None =
# the teacher's tokenizer, the others are trained on the distilled corpus
SHAPES = [
    (128, 512, 6, 1, None, 512),
    (128, 512, 6, 1, 4000, 256),
    (128, 256, 6, 1, 3000, 256),
    (112, 448, 6, 1, 4000, 256),
    (96, 384, 6, 1, 4000, 256),
    (96, 384, 6, 1, 3000, 256),
    (96, 384, 4, 1, 4000, 256),
    (96, 384, 4, 1, 3000, 512),
    (96, 384, 4, 1, 3000, 256),
    (96, 384, 3, 1, 4000, 256),
    (96, 256, 5, 1, 3000, 256),
    (80, 320, 6, 1, 4000, 256),
    (80, 320, 6, 1, 3000, 256),
    (64, 256, 6, 1, 4000, 256),
]


def random_export(meta: dict[str, Any], config: dict[str, Any], tmp: Path) -> tuple[int, Path]:
    """(parameters, int8 export directory ``tmp/int8``) of a perturbed random model of
    `config`; `meta`: the checkpoint metadata it carries (tokenizer, languages)."""
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig.from_dict(config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    state = {MODEL_PREFIX + k: v.detach() for k, v in model.state_dict().items()}
    atomic_save({"state_dict": state, META_KEY: {**meta, "model_config": config}}, tmp / "m.ckpt")
    out = export_model(tmp / "m.ckpt", tmp / "int8", quantization="int8", force=True)
    return model.num_parameters(), out


def package_size(meta: dict[str, Any], config: dict[str, Any], tmp: Path) -> tuple[int, int, int]:
    """(parameters, model.bin bytes, package bytes) of a perturbed random model of `config`."""
    params, out = random_export(meta, config, tmp)
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    return params, files["model.bin"], sum(files.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's .ckpt")
    parser.add_argument("--corpus", required=True, help="the distilled corpus directory")
    parser.add_argument("--langs", default="en,de", help="its two languages")
    args = parser.parse_args()
    torch.set_num_threads(1)
    meta = load_checkpoint(args.teacher)[META_KEY]
    base = dict(meta["model_config"])
    lines = [
        line
        for lang in args.langs.split(",")
        for line in (Path(args.corpus) / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    ]
    tokenizers = {None: meta["tokenizer"]}
    for vocab in sorted({s[4] for s in SHAPES if s[4] is not None}):
        model = train_spm(iter(lines), TokenizerConfig(vocab_size=vocab))
        tokenizers[vocab] = Tokenizer(model).to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        teacher = package_size(meta, base, Path(tmp))[2]
        print(f"teacher shape: package {teacher:,} bytes")
        for d, ff, enc, dec, vocab, positions in SHAPES:
            tok = Tokenizer.from_dict(tokenizers[vocab])
            config = {**base, "d_model": d, "d_ff": ff, "n_encoder_layers": enc,
                      "n_decoder_layers": dec, "max_positions": positions,
                      "src_vocab_size": tok.src_vocab_size, "tgt_vocab_size": tok.tgt_vocab_size}  # fmt: skip
            params, model_bin, package = package_size(
                {**meta, "tokenizer": tokenizers[vocab]}, config, Path(tmp)
            )
            print(
                f"d={d} ff={ff} {enc}+{dec} V={tok.src_vocab_size} pos={positions}: "
                f"{params:,} parameters, model.bin {model_bin:,}, package {package:,} "
                f"({100 * package / teacher:.1f} %)"
            )


if __name__ == "__main__":
    main()
