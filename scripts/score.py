"""Score sentence pairs with a trained checkpoint (forced decoding): one line per pair,
``log_prob<TAB>length-normalised score``, the numbers beam search ranks by.

    python scripts/score.py ckpt_path=model.ckpt src_file=test.en tgt_file=test.de
    python scripts/score.py ckpt_path=model.ckpt src_file=a.en tgt_file=a.de output=a.scores

See conf/score.yaml for every option and src/litmt/decoding/analysis/forced.py for the exact definitions.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("score", "litmt.cli.score:score")
