"""Export a checkpoint to a CTranslate2 model directory (int8 and other quantizations).

    python scripts/export.py ckpt_path=model.ckpt out=exports/en-de
    python scripts/export.py ckpt_path=model.ckpt out=exports/en-de-int8 quantization=int8

Prints the export directory. See conf/export.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("export", "litmt.cli.export:export")
