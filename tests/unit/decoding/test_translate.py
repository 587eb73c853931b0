"""The `Translator` API: batching, order, n-best, input hygiene and the output format."""

from __future__ import annotations

import io
import logging

import pytest
import tiny_checkpoint as tiny
from parity import SCORE_ATOL, assert_parity
from tiny_checkpoint import corpus

from litmt import Translator
from litmt.cli.translate import format_result
from litmt.data.text import read_lines, read_text_file, strip_line_end
from litmt.decoding.batching import even_parts, token_batches
from litmt.decoding.search.dispatch import decode
from litmt.errors import CheckpointError, ConfigError, DataError

pytestmark = pytest.mark.parity  # rerun in CI under another CPU setting (.ci/run)


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return tiny.tiny_checkpoint_path(tmp_path_factory)


@pytest.fixture(scope="session")
def translator(ckpt):
    return Translator.from_checkpoint(ckpt, device="cpu")


def test_translates_the_synthetic_task(translator):
    en, de = corpus(seed=1)
    hyps = translator.translate(en[:20], beam_size=3)
    assert sum(h == r for h, r in zip(hyps, de[:20], strict=True)) >= 15


def test_token_batches_respect_the_budget_and_cover_every_sentence():
    lengths = [5, 1, 9, 3, 3, 12, 7, 2]
    batches = token_batches(lengths, max_tokens=12)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 12
    assert token_batches([30], max_tokens=4) == [[0]]  # too long: alone, not dropped
    with pytest.raises(ConfigError, match="max_tokens must be positive"):
        token_batches([1], 0)


def test_even_parts_split_a_batch_without_a_small_remainder():
    """29 + 3 sentences is what filling up to the budget gives; even parts give 16 + 16."""
    batch = list(range(32))
    assert even_parts(batch, longest=35, max_tokens=1024) == [batch[:16], batch[16:]]
    parts = even_parts(list(range(10)), longest=4, max_tokens=12)  # 40 tokens: 4 parts
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert [i for p in parts for i in p] == list(range(10))  # every sentence, in order
    assert even_parts([7, 8], longest=3, max_tokens=100) == [[7, 8]]  # under the budget
    assert even_parts([7, 8], longest=300, max_tokens=100) == [[7], [8]]  # never empty
    with pytest.raises(ConfigError, match="max_tokens must be positive"):
        even_parts([1], 2, 0)


def test_output_order_does_not_depend_on_batching(translator):
    en, _ = corpus(seed=2)
    sents = [en[0], en[1] + " " + en[2], en[3], "A dog.", en[4] + " " + en[5] + " " + en[6]]
    one_batch = translator.translate(sents, beam_size=3, max_tokens=10_000)
    tiny_batches = translator.translate(sents, beam_size=3, max_tokens=8)
    one_by_one = [translator.translate([s], beam_size=3)[0] for s in sents]
    assert one_batch == tiny_batches == one_by_one


def test_empty_and_whitespace_inputs_give_empty_outputs_without_the_model(translator, monkeypatch):
    calls = []
    import litmt.decoding.translator as mod

    def spy(models, src, config=None, **kw):
        calls.append(src.size(0))
        return decode(models, src, config, **kw)

    monkeypatch.setattr(mod, "decode", spy)
    out = translator.translate(["", "A red dog runs.", "   \t ", "", "A cat eats."], beam_size=1)
    assert out[0] == out[2] == out[3] == ""
    assert out[1] and out[4]
    assert calls == [2]  # only the two real sentences reached the model
    assert translator.translate([""] * 3) == ["", "", ""]
    assert translator.translate([]) == []


def test_control_characters_are_removed_with_a_warning(translator, caplog):
    with caplog.at_level(logging.WARNING, logger="litmt"):
        out = translator.translate(["A red dog runs.", "A red\x00 dog\x1b runs.\r"], beam_size=1)
    assert out[0] == out[1]
    assert "line 2: removed 3 control character(s)" in caplog.text
    assert "line 1" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="litmt"):
        assert translator.translate(["\x07\x08"]) == [""]
    assert "line 1: removed 2 control character(s)" in caplog.text


def test_long_sources_are_truncated_to_max_positions_with_a_warning(translator, caplog):
    long = " ".join(["A big red dog runs outside."] * 40)
    n_ids = len(translator.tokenizer.encode_src([long])[0])
    assert n_ids > translator.max_source_tokens == 48
    with caplog.at_level(logging.WARNING, logger="litmt"):
        out = translator.translate(["A dog.", long], beam_size=2)
    assert len(out) == 2 and out[1]
    assert f"line 2: {n_ids} subword tokens, truncated to the model's maximum of 48" in caplog.text


def test_nbest_lists_are_sorted_and_start_with_the_one_best(translator):
    sents = ["A big bird sings outside.", "", "A young cat sleeps."]
    best = translator.translate(sents, beam_size=4)
    nbest = translator.translate(sents, beam_size=4, n_best=3)
    assert nbest[1] == [("", 0.0)]
    for i in (0, 2):
        assert len(nbest[i]) == 3
        scores = [s for _, s in nbest[i]]
        assert scores == sorted(scores, reverse=True)
        assert nbest[i][0][0] == best[i]
    scored = translator.translate(sents, beam_size=4, return_scores=True)
    # the same hypotheses; their scores come from batches of another shape (n_best=3 keeps
    # the search running longer), whose float32 sums may differ in the last bits
    assert [s[0][0] for s in scored] == [n[0][0] for n in nbest]
    assert [s[0][1] for s in scored] == pytest.approx([n[0][1] for n in nbest], abs=SCORE_ATOL)
    with pytest.raises(ConfigError, match="n_best must be between 1 and beam_size=2"):
        translator.translate(sents, beam_size=2, n_best=3)
    with pytest.raises(ConfigError, match="takes a list of sentences"):
        translator.translate("A dog.")  # type: ignore[arg-type]


def test_streaming_gives_the_same_results_in_chunks(translator):
    en, _ = corpus(seed=3)
    lines = [f"{s}\n" for s in en[:7]] + ["\n", "A dog runs.\r\n", "A cat eats."]
    expected = translator.translate([s.rstrip("\r\n") for s in lines], beam_size=2)
    streamed = list(translator.translate_stream(iter(lines), chunk_lines=3, beam_size=2))
    assert streamed == expected


def test_a_list_of_checkpoints_translates_with_their_mean(ckpt, tmp_path, translator):
    other = tiny.other_weights(ckpt, tmp_path / "other.ckpt", seed=1)
    avg = Translator.from_checkpoint([ckpt, other], device="cpu")
    tiny.assert_weights_are_the_mean(avg.model.state_dict(), [ckpt, other])
    by_hand = tiny.save_weights(ckpt, tiny.mean_weights([ckpt, other]), tmp_path / "mean.ckpt")
    en, _ = corpus(seed=4)
    reference = Translator.from_checkpoint(by_hand, device="cpu")
    expected = reference.translate(en[:5], beam_size=2)
    # the same weights up to float32 rounding of the mean: the same outputs but at near-ties
    sources = [reference.prepare(x) for x in en[:5]]
    assert_parity(reference, sources, expected, avg.translate(en[:5], beam_size=2), beam_size=2)


def test_missing_and_corrupt_checkpoints_raise_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint not found: .*nope\.ckpt"):
        Translator.from_checkpoint(tmp_path / "nope.ckpt")
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        Translator.from_checkpoint(bad)
    assert "\n" not in str(err.value)


def test_format_result():
    assert format_result("Ein Hund.", 0, 1, False) == ["Ein Hund."]
    assert format_result([("Ein Hund.", -0.51234)], 0, 1, True) == ["-0.5123\tEin Hund."]
    lines = format_result([("a", -0.1), ("b", -0.2)], 7, 3, True)
    assert lines == ["7\t-0.1000\ta", "7\t-0.2000\tb", "7\t-inf\t"]


# -- the one policy for reading text lines (read_lines) --------------------------------------


def read(data: bytes, name: str = "in.txt") -> list[str]:
    return list(read_lines(io.BytesIO(data), name))


def test_read_lines_policy_newlines_and_empty_lines():
    assert read(b"a\nb\n") == ["a", "b"]  # a final newline adds no empty line
    assert read(b"a\nb") == ["a", "b"]  # the last line needs no newline
    assert read(b"a\n\n\nb\n\n") == ["a", "", "", "b", ""]  # empty lines stay (alignment)
    assert read(b"") == [] and read(b"\n") == [""]
    assert read(b"a\r\nb\r\n") == ["a", "b"]  # CRLF
    # only \n ends a line: a lone CR, form feed, NEL, U+2028 stay inside it (str.splitlines
    # would split all of them and shift every later line)
    odd = "x\ry\x0cz\x85w\u2028v"
    assert read(f"{odd}\nnext\n".encode()) == [odd, "next"]
    assert read(b"a \t\n") == ["a \t"]  # other trailing whitespace is text


def test_read_lines_policy_bom_and_invalid_bytes(caplog):
    bom = b"\xef\xbb\xbf"
    assert read(bom + b"Hallo\n" + bom + b"x\n") == ["Hallo", "\ufeffx"]  # only the first
    with caplog.at_level(logging.WARNING, logger="litmt"):
        lines = read(b"ok\nA \xff\xfe bird.\nok\n", name="src_file")
    assert lines == ["ok", "A \ufffd\ufffd bird.", "ok"]
    assert "src_file line 2: bytes that are not UTF-8 replaced by U+FFFD" in caplog.text
    assert "line 1" not in caplog.text and "line 3" not in caplog.text


def test_read_lines_strict_mode_refuses_invalid_bytes_naming_line_and_byte():
    """Corpora read strictly: the same policy, but bad bytes are an error, not U+FFFD."""
    bom = b"\xef\xbb\xbf"
    assert list(read_lines(io.BytesIO(bom + b"a\r\nb"), "c", strict=True)) == ["a", "b"]
    with pytest.raises(DataError) as exc:
        list(read_lines(io.BytesIO(bom + b"ok\nA \xff bird.\n"), "train.de", strict=True))
    # byte offset 8 in the file: after the BOM (3), "ok\n" (3) and "A " (2)
    assert str(exc.value).startswith("train.de: invalid UTF-8 at line 2 (byte 8); re-encode")


def test_read_lines_yields_each_line_as_soon_as_it_is_read():
    class OneLineAtATime(io.RawIOBase):  # like a terminal: read() returns one line, then waits
        def __init__(self) -> None:
            self.lines = [b"first\n", b"second\n"]
            self.reads = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            self.reads += 1
            if not self.lines:
                return 0
            line = self.lines.pop(0)
            buffer[: len(line)] = line
            return len(line)

    raw = OneLineAtATime()
    lines = read_lines(io.BufferedReader(raw), "stdin")
    assert next(lines) == "first" and raw.reads == 1  # did not wait for the second line
    assert list(lines) == ["second"]


def test_translate_stream_strips_line_ends_by_the_same_policy(translator):
    assert strip_line_end("a\r\n") == "a" and strip_line_end("a\r") == "a"
    assert strip_line_end("a\n\n") == "a\n" and strip_line_end("\ra") == "\ra"
    streamed = list(translator.translate_stream(["A dog runs.\r\n", "A cat eats."], beam_size=1))
    assert streamed == translator.translate(["A dog runs.", "A cat eats."], beam_size=1)


def test_read_text_file_names_a_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"ref_file not found: .*nope\.de"):
        read_text_file(tmp_path / "nope.de", "ref_file")
    (tmp_path / "bom.de").write_bytes(b"\xef\xbb\xbfEin Hund.\r\n\r\nZwei.")
    assert read_text_file(tmp_path / "bom.de", "ref_file") == ["Ein Hund.", "", "Zwei."]
