"""Key redaction in log lines: whole tokens only, keys forgotten when their server stops,
and a dict of arguments redacted by its api_key entry."""

from __future__ import annotations

import logging

from litmt.deploy.server.log_redaction import REDACTED, forget_keys_in_logs, redact_keys_in_logs


def _line(caplog, msg: str, *args) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="litmt.test_redaction"):
        logging.getLogger("litmt.test_redaction").info(msg, *args)
    return caplog.records[-1].getMessage()


def test_a_key_is_redacted_as_a_whole_token_not_inside_other_words(caplog):
    redact_keys_in_logs(["small"])
    try:
        assert _line(caplog, "key small used") == f"key {REDACTED} used"
        assert _line(caplog, "beam 3 is smaller than 4") == "beam 3 is smaller than 4"
    finally:
        forget_keys_in_logs(["small"])


def test_a_stopped_servers_keys_are_forgotten_unless_another_holds_them(caplog):
    redact_keys_in_logs(["k-alpha-1"])
    redact_keys_in_logs(["k-alpha-1"])  # a second server of the process holds it too
    forget_keys_in_logs(["k-alpha-1"])
    assert _line(caplog, "saw k-alpha-1") == f"saw {REDACTED}"
    forget_keys_in_logs(["k-alpha-1"])
    assert _line(caplog, "saw k-alpha-1") == "saw k-alpha-1"


def test_a_dict_argument_is_redacted_by_its_api_key_entry(caplog):
    redact_keys_in_logs()
    assert _line(caplog, "body: %s", {"api_key": "zz-unknown", "q": "hi"}) == (
        f"body: {{'api_key': '{REDACTED}', 'q': 'hi'}}"
    )
