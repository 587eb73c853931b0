"""Score a checkpoint with sacreBLEU BLEU, chrF and TER.

    python scripts/evaluate.py ckpt_path=model.ckpt src_file=test.en ref_file=test.de \
        hyp_file=test.hyp beam_size=5
    python scripts/evaluate.py 'ckpt_path=[a.ckpt,b.ckpt]' data=multi30k split=test
    python scripts/evaluate.py run_dir=logs/train/runs/RUN average_last=5 data=multi30k

See conf/evaluate.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("evaluate", "litmt.cli.evaluate:evaluate")
