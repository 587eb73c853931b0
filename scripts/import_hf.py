"""Import a transformers Marian model directory (e.g. an OPUS-MT model) as a litmt checkpoint.

    huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de
    python scripts/import_hf.py model_dir=opus-mt-en-de out=opus-mt-en-de.ckpt

Prints the checkpoint path. See conf/import_hf.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("import_hf", "litmt.cli.import_hf:import_hf")
