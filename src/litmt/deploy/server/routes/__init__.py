"""The server's routes: LibreTranslate's /translate and friends (translate, libretranslate), /languages and /health (info), the attention explorer (explorer, attention_view)."""
