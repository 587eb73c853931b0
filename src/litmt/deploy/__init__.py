"""Shipping: the CTranslate2 export and engine, load_translator (the engine switch, engines), the HTTP server, its request batcher and static page."""
