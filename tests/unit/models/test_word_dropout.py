"""`model.word_dropout`: whole source tokens dropped while training, nothing else touched."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_model import tiny_config

from litmt.errors import ConfigError
from litmt.models import Seq2SeqTransformer


def _first_layer_inputs(model: Seq2SeqTransformer, src, tgt) -> dict[str, torch.Tensor]:
    """The (B, L, C) inputs of the first encoder and decoder layers in one forward pass."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.encoder_layers[0].register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("src", args[0].detach().clone())
        ),
        model.decoder_layers[0].register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("tgt", args[0].detach().clone())
        ),
    ]
    try:
        model(src, tgt)
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_word_dropout_zeroes_whole_source_tokens_and_scales_the_rest():
    p = 0.5
    torch.manual_seed(0)
    model = Seq2SeqTransformer(tiny_config(word_dropout=p)).train()
    src = torch.randint(4, 60, (4, 16))
    tgt = torch.randint(4, 60, (4, 9))
    seen = _first_layer_inputs(model, src, tgt)

    scale = math.sqrt(model.config.d_model)
    pos = model.pos_encoding(src.size(1))  # (S, C)
    emb = model.src_embed(src) * scale  # (B, S, C)
    dropped = (seen["src"] - pos).abs().amax(-1) < 1e-5  # (B, S): nothing left but the position
    keep = (~dropped).float()[..., None] / (1 - p)  # (B, S, 1)
    # each token is dropped whole (only its position is left) or kept whole, scaled by 1/(1-p)
    torch.testing.assert_close(seen["src"], emb * keep + pos)
    assert 0 < int(dropped.sum()) < dropped.numel()

    # the target side is never dropped
    tgt_ref = model.tgt_embed(tgt) * scale + model.pos_encoding(tgt.size(1))
    torch.testing.assert_close(seen["tgt"], tgt_ref)


def test_word_dropout_is_off_in_eval_mode():
    torch.manual_seed(0)
    with_drop = Seq2SeqTransformer(tiny_config(word_dropout=0.3)).eval()
    plain = Seq2SeqTransformer(tiny_config()).eval()
    plain.load_state_dict(with_drop.state_dict())
    src, tgt = torch.randint(4, 60, (3, 11)), torch.randint(4, 60, (3, 7))
    torch.testing.assert_close(with_drop(src, tgt), plain(src, tgt))


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_word_dropout_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"model.word_dropout must be in \[0, 1\)"):
        tiny_config(word_dropout=value)


def test_exempt_ids_are_never_dropped():
    torch.manual_seed(1)
    model = Seq2SeqTransformer(tiny_config(word_dropout=0.8, positional="rope")).train()
    model.exempt_from_word_dropout([5, 7])
    src = torch.randint(8, 60, (6, 20))
    src[:, 0], src[:, 1], src[:, -1] = 5, 7, 5  # e.g. a language tag, a corpus tag, eos
    seen = _first_layer_inputs(model, src, torch.randint(4, 60, (6, 5)))
    emb = model.src_embed(src) * math.sqrt(model.config.d_model)  # rope: no added positions
    exempt = (src == 5) | (src == 7)
    torch.testing.assert_close(seen["src"][exempt], emb[exempt])  # kept, unscaled
    dropped = seen["src"].abs().amax(-1) == 0
    assert bool(dropped[~exempt].any()) and not bool(dropped[exempt].any())


def test_the_training_module_exempts_eos_bos_and_the_tokenizers_tags():
    from tiny_corpora import make_pairs

    from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, Tokenizer, TokenizerConfig
    from litmt.training.module import TranslationModule

    src, tgt = make_pairs(60, seed=5)
    tok = Tokenizer.train(
        src, tgt, TokenizerConfig(vocab_size=80, user_defined_symbols=["<2de>", "<BT>"])
    )
    module = TranslationModule(
        tiny_config(src_vocab_size=tok.src.get_piece_size(), word_dropout=0.1),
        tokenizer=tok,
        src_lang="en",
        tgt_lang="de",
    )
    exempt = set(module.model.word_dropout_exempt.nonzero().flatten().tolist())
    tags = {tok.src.piece_to_id("<2de>"), tok.src.piece_to_id("<BT>")}
    assert exempt == {BOS_ID, EOS_ID} | tags
