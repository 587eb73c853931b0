"""Distil a corpus: translate its training split with a teacher (sequence-level KD).

    python scripts/distill.py ckpt_path=teacher.ckpt data.dir=../shared/data/multi30k out=data/kd
    python scripts/distill.py ckpt_path=teacher.ckpt data.dir=DIR out=DIR_KD max_chunks=3

Writes {out}/train.{src_lang,tgt_lang} and {out}/distill.json; a rerun resumes. See
conf/distill.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("distill", "litmt.cli.distillation.distill:distill")
