"""`litmt.config`: the one unknown-key check and the one rename rule every command uses."""

from __future__ import annotations

import logging

import pytest

from litmt.config import check_keys, renamed_keys
from litmt.errors import ConfigError


def test_unknown_keys_are_one_line_with_a_close_match() -> None:
    with pytest.raises(ConfigError, match=r"^unknown data.tokenizer keys \['vocab'\] \(did you "):
        check_keys({"vocab": 1}, ["vocab_size", "joint"], "data.tokenizer")
    check_keys({"joint": True}, ["vocab_size", "joint"], "data.tokenizer")  # no error


def test_an_old_key_moves_to_its_new_name_and_into_a_block(caplog) -> None:
    given = {"req_limit": 7, "access": {"api_keys_env": None}, "model_path": "m.ckpt"}
    with caplog.at_level(logging.WARNING, logger="litmt.config"):
        out = renamed_keys(
            given, {"req_limit": "access.req_limit", "model_path": "ckpt_path"}, "serve"
        )
    assert out == {"access": {"api_keys_env": None, "req_limit": 7}, "ckpt_path": "m.ckpt"}
    assert given["access"] == {"api_keys_env": None}  # the caller's block is not changed
    assert caplog.messages == [
        "serve: req_limit is deprecated and will be removed in litmt 0.3.0; use access.req_limit",
        "serve: model_path is deprecated and will be removed in litmt 0.3.0; use ckpt_path",
    ]


def test_old_and_new_spellings_that_disagree_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^serve: req_limit is the old name of access"):
        renamed_keys(
            {"req_limit": 7, "access": {"req_limit": 8}}, {"req_limit": "access.req_limit"}, "serve"
        )
    same = renamed_keys(
        {"req_limit": 7, "access": {"req_limit": 7}}, {"req_limit": "access.req_limit"}, "serve"
    )
    assert same == {"access": {"req_limit": 7}}
