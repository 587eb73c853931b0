"""A tiny trained translator for decoding tests: synthetic English→German, seconds on CPU.

`build_tiny_checkpoint(directory)` trains a sentencepiece tokenizer and a 2-layer model on
a few hundred template sentences ("a red dog runs ." → "ein roter Hund rennt .") and saves a
litmt checkpoint. It is cached per test session by `tiny_checkpoint_path`.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from litmt.checkpoint.io import save_model_checkpoint
from litmt.data.tokenization.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerConfig
from litmt.models import Seq2SeqTransformer, TransformerConfig

ADJ = {"red": "roter", "big": "großer", "small": "kleiner", "old": "alter", "young": "junger"}
NOUN = {"dog": "Hund", "man": "Mann", "boy": "Junge", "cat": "Kater", "bird": "Vogel"}
VERB = {"runs": "rennt", "sleeps": "schläft", "eats": "isst", "sings": "singt", "walks": "geht"}
PLACE = {"": "", "outside": "draußen", "here": "hier", "today": "heute"}


def corpus(seed: int = 0) -> tuple[list[str], list[str]]:
    """All template pairs, shuffled: (english, german)."""
    pairs = []
    for (a, a2), (n, n2), (v, v2), (p, p2) in itertools.product(
        ADJ.items(), NOUN.items(), VERB.items(), PLACE.items()
    ):
        en = " ".join(w for w in ("A", a, n, v, p) if w) + "."
        de = " ".join(w for w in ("Ein", a2, n2, v2, p2) if w) + "."
        pairs.append((en, de))
    random.Random(seed).shuffle(pairs)
    return [e for e, _ in pairs], [d for _, d in pairs]


def _batch(ids: list[list[int]], bos_eos: bool) -> torch.Tensor:
    seqs = [[BOS_ID, *s, EOS_ID] if bos_eos else s for s in ids]
    out = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


# The tiny translator's model: 2 + 2 layers of width 64, no dropout.
TINY = {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_encoder_layers": 2, "n_decoder_layers": 2}


def tiny_config(vocab_size: int, **overrides: object) -> TransformerConfig:
    """The tiny translator's config for a joint vocabulary of `vocab_size`; `overrides` set
    any other `TransformerConfig` field (e.g. a smaller model for checkpoint tests)."""
    base = {"src_vocab_size": vocab_size, **TINY, "dropout": 0.0, "max_positions": 48}
    return TransformerConfig(**{**base, **overrides})


def fit(
    model: Seq2SeqTransformer,
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    steps: int,
    lr: float,
) -> Seq2SeqTransformer:
    """`steps` Adam steps on random batches of 32 pairs (seeded), then eval mode."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(src_ids), (32,), generator=gen).tolist()
        src = _batch([src_ids[i] for i in idx], bos_eos=False)
        tgt = _batch([tgt_ids[i] for i in idx], bos_eos=True)
        logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def build_tiny_checkpoint(
    directory: Path, steps: int = 60, lr: float = 3e-3, **overrides: object
) -> Path:
    """Train the tiny model (`overrides`: other `tiny_config` fields) for `steps` Adam steps and
    save ``directory/tiny.ckpt`` (a few seconds on CPU)."""
    torch.manual_seed(0)
    en, de = corpus()
    tok = Tokenizer.train(en, de, TokenizerConfig(vocab_size=80, model_type="unigram"))
    config = tiny_config(tok.src_vocab_size, **overrides)
    model = fit(Seq2SeqTransformer(config), tok.encode_src(en), tok.encode_tgt(de), steps, lr)
    return save_model_checkpoint(directory / "tiny.ckpt", model, tok, "en", "de")


def other_weights(path: Path, out: Path, seed: int) -> Path:
    """A copy of checkpoint `path` (same config, tokenizer, languages: the same run) whose
    weights are a fresh random initialisation, so that averaging it with `path` matters."""
    raw = torch.load(path, weights_only=True)
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(TransformerConfig.from_dict(raw["litmt"]["model_config"]))
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}
    assert weights.keys() == raw["state_dict"].keys()
    torch.save({**raw, "state_dict": weights}, out)
    return out


def mean_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The parameter-by-parameter mean of the checkpoints' model weights, in float64, computed
    with plain torch (keys without the ``model.`` prefix, as in ``model.state_dict()``)."""
    states = [torch.load(p, weights_only=True)["state_dict"] for p in paths]
    return {
        k.removeprefix("model."): sum(s[k].double() for s in states) / len(states)
        for k in states[0]
    }


def save_weights(path: Path, weights: dict[str, torch.Tensor], out: Path) -> Path:
    """Checkpoint `path` with its model weights replaced by `weights` (e.g. `mean_weights`)."""
    raw = torch.load(path, weights_only=True)
    state = {f"model.{k}": v.to(raw["state_dict"][f"model.{k}"].dtype) for k, v in weights.items()}
    torch.save({**raw, "state_dict": state}, out)
    return out


def assert_weights_are_the_mean(state: dict[str, torch.Tensor], paths: list[Path]) -> None:
    """`state` (a model state dict) is the mean of the checkpoints at `paths`, parameter by
    parameter, and is not any single one of them (so the check can fail)."""
    expected = mean_weights(paths)
    assert state.keys() == expected.keys()
    for k, v in expected.items():
        torch.testing.assert_close(state[k].double(), v, rtol=1e-6, atol=1e-6, msg=k)
    for p in paths:
        single = mean_weights([p])
        assert any(not torch.allclose(state[k].double(), single[k]) for k in single), p


def tiny_checkpoint_path(tmp_path_factory) -> Path:
    """The session's tiny checkpoint, built on first use."""
    directory = tmp_path_factory.getbasetemp() / "tiny_checkpoint"
    path = directory / "tiny.ckpt"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        build_tiny_checkpoint(directory)
    return path


# French for the multilingual tiny model (en→de and en→fr from the same English templates)
FR_WORDS = {
    "Ein": "Un", "roter": "rouge", "großer": "grand", "kleiner": "petit", "alter": "vieux",
    "junger": "jeune", "Hund": "chien", "Mann": "homme", "Junge": "garçon", "Kater": "chat",
    "Vogel": "oiseau", "rennt": "court", "schläft": "dort", "isst": "mange", "singt": "chante",
    "geht": "marche", "draußen": "dehors", "hier": "ici", "heute": "aujourd'hui",
}  # fmt: skip


# Czech-like words for a third target (the output may be nonsense where only routing matters)
CS_WORDS = {
    "Ein": "Jeden", "roter": "červený", "großer": "velký", "kleiner": "malý", "alter": "starý",
    "junger": "mladý", "Hund": "pes", "Mann": "muž", "Junge": "chlapec", "Kater": "kocour",
    "Vogel": "pták", "rennt": "běží", "schläft": "spí", "isst": "jí", "singt": "zpívá",
    "geht": "jde", "draußen": "venku", "hier": "zde", "heute": "dnes",
}  # fmt: skip
WORDS = {"fr": FR_WORDS, "cs": CS_WORDS}  # German word -> the other targets' words


def build_tiny_multilingual_checkpoint(
    directory: Path,
    placement: str = "source",
    steps: int = 80,
    lr: float = 3e-3,
    targets: tuple[str, ...] = ("de", "fr"),
    vocab_size: int = 100,
    name: str | None = None,
) -> Path:
    """The tiny model trained on en→`targets` at once (`data.directions=[en-de, en-fr]` by
    default), the target-language token `<2xx>` on the source or as the first target token
    (`placement`); saves ``directory/name`` (default ``tiny_multi_{placement}.ckpt``)
    recording its directions."""
    torch.manual_seed(0)
    en, de = corpus()
    texts = {
        lang: de
        if lang == "de"
        else [" ".join(WORDS[lang].get(w.rstrip("."), w.rstrip(".")) for w in s.split()) + "."
              for s in de]
        for lang in targets
    }  # fmt: skip
    tags = [f"<2{lang}>" for lang in targets]
    settings = TokenizerConfig(
        vocab_size=vocab_size, model_type="unigram", user_defined_symbols=tags
    )
    tok = Tokenizer.train(en * len(targets), [t for lang in targets for t in texts[lang]], settings)
    src_text, tgt_text = [], []
    for tag, lang in zip(tags, targets, strict=True):
        for e, t in zip(en, texts[lang], strict=True):
            src_text.append(f"{tag} {e}" if placement == "source" else e)
            tgt_text.append(f"{tag} {t}" if placement == "target" else t)
    config = tiny_config(tok.src_vocab_size)
    model = fit(
        Seq2SeqTransformer(config), tok.encode_src(src_text), tok.encode_tgt(tgt_text), steps, lr
    )
    languages = {"directions": [f"en-{lang}" for lang in targets], "tag_placement": placement}
    return save_model_checkpoint(
        directory / (name or f"tiny_multi_{placement}.ckpt"), model, tok, "en", "de",
        languages=languages,
    )  # fmt: skip
