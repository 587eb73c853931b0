"""Save attention heatmaps (cross, encoder self, decoder self) of one sentence as PNG.

    python scripts/visualize_attention.py ckpt_path=model.ckpt sentence="A man is walking." \
        kind=cross layers=[-1] grid=true out=attn.png

See conf/visualize_attention.yaml for every option.
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("visualize_attention", "litmt.cli.visualize:visualize")
