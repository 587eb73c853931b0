"""The server's attention view: the attention maps of one translation as JSON for the explorer page (`static/`)."""

from __future__ import annotations

from typing import Any

from litmt.data.text import clean_line
from litmt.decoding.config import DecodeConfig
from litmt.deploy.server.errors import ApiError


def attention_maps(
    translator: Any,
    sentence: str,
    options: dict[str, Any],
    max_target: int | None = None,
    route: Any = None,
) -> Any:
    """The greedy translation's attention maps; at most `max_target` target tokens.

    `route`: a multilingual model's direction (a `litmt.decoding.languages.Route`, from
    `Translator.route`); None = its first direction. Ignored for a one-pair model.
    """
    import math

    from litmt.data.directions import lang_tag
    from litmt.decoding.analysis.attention_maps import collect_attention
    from litmt.runtime.precision import autocast_context

    # one line (the page sends one sentence), cleaned as every engine cleans its input
    cleaned = clean_line(sentence.replace("\n", " "), "attention request")
    languages = getattr(translator, "languages", None)
    prefix: list[int] = []
    if languages is not None and languages.multilingual:
        if route is None:  # the model's first direction
            first = languages.directions[0]
            route = translator.route(first.src, first.tgt)
        # the target-language token on the source side, or forced as the first target
        # token: the route `Translator.translate` takes
        if route.placement == "source":
            cleaned = f"{lang_tag(route.tgt_lang)} {cleaned}"
        else:
            prefix = route.prefix_ids(None) or []
    config = DecodeConfig.from_options(options)  # null/absent keys: DecodeConfig's defaults
    max_len_a, max_len_b = config.max_len_a, config.max_len_b
    if max_target is not None:  # the same budget rule, capped: floor(0 * S + min(budget, cap))
        n_src = len(translator.tokenizer.encode_src([cleaned])[0])
        max_len_a, max_len_b = 0.0, min(math.floor(max_len_a * n_src + max_len_b), max_target)
    # the Translator's autocast: a flash/te checkpoint's kernel computes in half only
    with autocast_context(translator.device, translator.autocast):
        return collect_attention(
            translator.model,
            translator.tokenizer,
            cleaned,
            prefix=prefix,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
        )


def _index(value: Any, n: int | None, what: str) -> int | None:
    """`value` (a request's ``layer`` or ``head``) as an index into `n` (None: not checked
    against a count), None for the mean; 400 for anything else."""
    if value is None or value == "mean":
        return None
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise TypeError(value)  # true/false, 1.5, NaN, infinity: not an index
        i = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ApiError(400, f"Invalid request: {what} must be an integer or 'mean'") from exc
    if n is None:
        return i
    if not -n <= i < n:
        raise ApiError(400, f"Invalid request: {what} {i} does not exist (the model has {n})")
    return i % n


def check_choice(translator: Any, layer: Any, head: Any) -> None:
    """400 for a ``layer``/``head`` that `attention_payload` would refuse, checked before
    any decoding: against the model's decoder layers and heads when its config tells them."""
    config = getattr(getattr(translator, "model", None), "config", None)
    n_layers = getattr(config, "n_decoder_layers", None)
    n_heads = getattr(config, "n_heads", None)
    if layer != "all":
        _index(layer, n_layers, "layer")
        _index(head, n_heads, "head")


def attention_payload(maps: Any, layer: Any, head: Any) -> dict[str, Any]:
    """JSON of `AttentionMaps` cross-attention: one (T, S) map (default: the last layer, the
    mean over heads), or every weight [L][H][T][S] with ``layer="all"``."""
    cross = maps.weights["cross"]  # L x (H, T, S)
    n_layers, n_heads = len(cross), int(cross[0].size(0))
    payload: dict[str, Any] = {
        "translation": maps.translation,
        "source_pieces": maps.src_pieces,
        "target_pieces": maps.tgt_out_pieces,
        "layers": n_layers,
        "heads": n_heads,
    }
    if layer == "all":
        payload["weights"] = [[_rounded(h) for h in w] for w in cross]  # (L, H, T, S)
        return payload
    li = _index(layer, n_layers, "layer")
    chosen = cross[li if li is not None else n_layers - 1]  # (H, T, S)
    hi = _index(head, n_heads, "head")
    payload.update(
        layer=li if li is not None else n_layers - 1,
        head=hi if hi is not None else "mean",
        weights=_rounded(chosen.mean(0) if hi is None else chosen[hi]),  # (T, S)
    )
    return payload


def _rounded(matrix: Any) -> list[list[float]]:
    return [[round(float(x), 4) for x in row] for row in matrix.tolist()]
