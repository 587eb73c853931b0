"""Translate sentences with a trained checkpoint (stdin → stdout by default).

    echo "A man is walking." | python scripts/translate.py ckpt_path=model.ckpt
    python scripts/translate.py ckpt_path=model.ckpt input=test.en output=test.hyp beam_size=5
    python scripts/translate.py ckpt_path=model.ckpt 'text=["A man.", "A dog."]' n_best=3

See conf/translate.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("translate", "litmt.cli.translate:translate")
