"""Serve a model over HTTP: the LibreTranslate API and the attention explorer page.

    python scripts/serve.py ckpt_path=model.ckpt port=5000
    python scripts/serve.py ckpt_path=exports/en-de-int8 threads=2

See conf/serve.yaml for every option (the server's: litmt.deploy.server.config.ServeConfig).
"""

from litmt.cli.script.runner import run_script

if __name__ == "__main__":
    run_script("serve", "litmt.cli.serve:serve")
