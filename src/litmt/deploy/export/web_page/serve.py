"""Serve this folder on http://localhost:8000/ with the cross-origin isolation headers the
page needs for wasm threads (python -m http.server cannot send them; the page then runs on
one thread). Standard library only:

    python serve.py [--port 8000] [--bind 127.0.0.1]
"""

import argparse
import functools
import http.server
from pathlib import Path

HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}


class Isolated(http.server.SimpleHTTPRequestHandler):
    """python's static file handler, every answer with `HEADERS`."""

    def end_headers(self) -> None:
        for name, value in HEADERS.items():
            self.send_header(name, value)
        super().end_headers()


def main() -> None:
    parser = argparse.ArgumentParser(description="serve this folder with COOP/COEP headers")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--bind", default="127.0.0.1")
    args = parser.parse_args()
    handler = functools.partial(Isolated, directory=str(Path(__file__).resolve().parent))
    with http.server.ThreadingHTTPServer((args.bind, args.port), handler) as server:
        print(f"serving on http://{args.bind}:{args.port}/ (cross-origin isolated)")
        server.serve_forever()


if __name__ == "__main__":
    main()
