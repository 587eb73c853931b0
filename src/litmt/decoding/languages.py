"""Which directions a model translates, and how a requested direction reaches it.

Every entry point (`Translator.translate`, ``translate.py``/``evaluate.py``/``score.py``
``src_lang=``/``tgt_lang=``, the server's ``source``/``target``) resolves the direction here,
so an unknown one is the same one-line `ConfigError` everywhere (a 400 on the server).

- A one-pair model (no ``directions`` in its checkpoint) translates its ``src_lang`` →
  ``tgt_lang``; asking for any other pair is refused, asking for none is that pair.
- A multilingual model (`litmt.data.directions`) translates the directions it was trained
  on. The route carries the target-language token: prepended to the source ids
  (``tag_placement=source``) or forced as the first target token (``target``, a one-token
  target prefix). A direction between known languages that was never trained (e.g. de→fr
  for a model trained on en→de and en→fr) is zero-shot: refused unless
  ``allow_zero_shot=true``, then decoded and reported as zero-shot (a warning and the
  route's ``zero_shot`` field).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from litmt.data.directions import Direction, check_placement, parse_directions
from litmt.data.tokenization.tokenizer import Tokenizer
from litmt.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """How one request reaches the model.

    Args:
        src_lang, tgt_lang: the resolved direction.
        tag_id: the target-language token's id (None for a one-pair model).
        placement: "source" (prepended to the source ids) or "target" (forced first target
            token); meaningless when `tag_id` is None.
        zero_shot: the direction was never trained.
    """

    src_lang: str
    tgt_lang: str
    tag_id: int | None = None
    placement: str = "source"
    zero_shot: bool = False

    def source_ids(self, ids: list[int], max_len: int) -> list[int]:
        """`ids` with the source-side tag (``[tag, *ids]``, at most `max_len`); empty stays
        empty (it gives "" without running the model)."""
        if self.tag_id is None or self.placement != "source" or not ids:
            return ids
        return [self.tag_id, *ids][:max_len]

    def untagged_alignment(self, links: str) -> str:
        """A Pharaoh alignment ``"i-j ..."`` of the tagged ids with the language token's word
        (source word 0, or target word 0) removed and the other words renumbered, so that
        the indices count the words of the text the user gave and got."""
        if self.tag_id is None or not links:
            return links
        side = 0 if self.placement == "source" else 1
        out = []
        for link in links.split():
            pair = [int(x) for x in link.split("-")]
            if pair[side] == 0:
                continue
            pair[side] -= 1
            out.append(f"{pair[0]}-{pair[1]}")
        return " ".join(out)

    def prefix_ids(self, prefix: list[int] | None) -> list[int] | None:
        """The target ids decoding must start with: the target-side tag, then `prefix`."""
        if self.tag_id is None or self.placement != "target":
            return prefix
        return [self.tag_id, *(prefix or [])]


@dataclass
class Languages:
    """The directions of a model (`from_meta`: its checkpoint's or export's metadata)."""

    src_lang: str  # the one pair, or the first direction
    tgt_lang: str
    directions: list[Direction] = field(default_factory=list)  # [] = one pair
    placement: str = "source"  # where the target-language token goes (multilingual)

    @classmethod
    def from_meta(
        cls, meta: Mapping[str, Any], src_lang: str = "", tgt_lang: str = ""
    ) -> Languages:
        """From checkpoint/export metadata (``src_lang``, ``tgt_lang``, ``directions``,
        ``tag_placement``); `src_lang`/`tgt_lang` when the metadata lacks them."""
        return cls(
            str(meta.get("src_lang") or src_lang),
            str(meta.get("tgt_lang") or tgt_lang),
            parse_directions(meta.get("directions")),
            check_placement(str(meta.get("tag_placement") or "source")),
        )

    @property
    def multilingual(self) -> bool:
        return bool(self.directions)

    def pairs(self) -> list[tuple[str, str]]:
        """Every trained (source, target) pair, in training order."""
        if self.directions:
            return [(d.src, d.tgt) for d in self.directions]
        return [(self.src_lang, self.tgt_lang)] if self.src_lang and self.tgt_lang else []

    def names(self) -> str:
        """``en-de, en-fr`` for messages."""
        return ", ".join(f"{s}-{t}" for s, t in self.pairs()) or "an unnamed pair"

    def targets_of(self, src: str, allow_zero_shot: bool = False) -> list[str]:
        """Target languages reachable from `src` (trained; with `allow_zero_shot` also the
        zero-shot ones)."""
        out = [t for s, t in self.pairs() if s == src]
        if allow_zero_shot and self.directions and src in self._languages():
            out += [t for t in self._targets() if t != src and t not in out]
        return out

    def sources(self) -> list[str]:
        """Source languages of the trained directions, in order."""
        return list(dict.fromkeys(s for s, _ in self.pairs()))

    def _languages(self) -> set[str]:
        return {lang for pair in self.pairs() for lang in pair}

    def _targets(self) -> list[str]:
        return list(dict.fromkeys(t for _, t in self.pairs()))

    def route(
        self,
        tokenizer: Tokenizer,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        *,
        allow_zero_shot: bool = False,
    ) -> Route:
        """The `Route` of a requested direction (None = the model's only choice).

        Raises:
            ConfigError: a direction the model does not know, a zero-shot one without
                `allow_zero_shot`, or no `tgt_lang` where the model has several targets.
        """
        src_lang, tgt_lang = src_lang or None, tgt_lang or None
        if not self.directions:
            src, tgt = src_lang or self.src_lang, tgt_lang or self.tgt_lang
            known = (self.src_lang or src, self.tgt_lang or tgt)
            if (src, tgt) != known:
                raise ConfigError(
                    f"this model translates {known[0]}-{known[1]} only, not {src}-{tgt}; "
                    f"use a model trained for {src}-{tgt}"
                )
            return Route(src, tgt)
        if tgt_lang is None:
            targets = self._targets()
            if len(targets) != 1:
                raise ConfigError(
                    f"this model translates {self.names()}; say which with tgt_lang=XX"
                )
            tgt_lang = targets[0]
        if src_lang is None:
            sources = [s for s, t in self.pairs() if t == tgt_lang] or self.sources()
            if len(set(sources)) != 1:
                raise ConfigError(
                    f"this model translates {self.names()}; say which with src_lang=XX"
                )
            src_lang = sources[0]
        tag_id = tokenizer.tgt_tags.get(f"<2{tgt_lang}>")
        if (src_lang, tgt_lang) in self.pairs():
            assert tag_id is not None, f"the tokenizer lacks <2{tgt_lang}>"
            return Route(src_lang, tgt_lang, tag_id, self.placement)
        zero_shot = src_lang in self._languages() and tgt_lang in self._targets()
        if not zero_shot or tag_id is None:
            raise ConfigError(f"this model translates {self.names()}, not {src_lang}-{tgt_lang}")
        if not allow_zero_shot:
            raise ConfigError(
                f"{src_lang}-{tgt_lang} was never trained (the model translates "
                f"{self.names()}); pass allow_zero_shot=true to try it zero-shot"
            )
        log.warning("%s-%s is zero-shot: never seen in training", src_lang, tgt_lang)
        return Route(src_lang, tgt_lang, tag_id, self.placement, zero_shot=True)


__all__ = ["Languages", "Route"]
