"""A request's parameters, read within the body limit, and its texts checked against the limits.

Both follow LibreTranslate (``request.values``; its ``char_limit``), with a 413 naming the
limit where LibreTranslate answers 400.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from litmt.deploy.server.config import ServeConfig
from litmt.deploy.server.errors import ApiError

log = logging.getLogger(__name__)


def _replay(body: bytes) -> Callable[[], Any]:
    """An ASGI ``receive`` that hands `body` (already read) to a second `Request`."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    """The request body; 413 past `max_body_bytes` (declared or counted across its chunks);
    499 when the client goes before its body is in (one log line, no traceback)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise ApiError(
            413, f"Request body of {declared} bytes exceeds the limit ({max_body_bytes})"
        )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ApiError(413, f"Request body exceeds the limit ({max_body_bytes} bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        log.warning(
            "client %s went before its body was in (%d of %s bytes)",
            request.client.host if request.client else "?",
            size,
            declared if declared is not None else "?",
        )
        raise ApiError(499, "Client closed the request") from None
    return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any]:
    """`body` as a JSON object; 400 for anything else."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON format: {exc}") from exc
    except ValueError:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
        raise ApiError(400, "Invalid JSON format: a number has too many digits") from None
    except RecursionError:  # [[[[... within the body limit
        raise ApiError(400, "Invalid JSON format: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "Invalid JSON format: expected an object")
    return data


def _valid_unicode(text: str) -> bool:
    """Whether `text` encodes to UTF-8: no lone surrogate (JSON's ``"\\ud800"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(params: dict[str, Any]) -> None:
    """400 naming the first field of `params` with a lone surrogate in a key or a string,
    at any depth: no tokenizer can read it, and no answer can quote it."""
    for name, value in params.items():
        label = name if _valid_unicode(name) else "a field name"
        stack: list[Any] = [name, value]
        while stack:  # iterative: as deep as the JSON parser allowed
            item = stack.pop()
            if isinstance(item, str) and not _valid_unicode(item):
                raise ApiError(
                    400, f"Invalid request: {label} is not valid Unicode (a lone surrogate)"
                )
            if isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                stack.extend([*item.keys(), *item.values()])


async def read_params(
    request: Request, max_body_bytes: int, files: dict[str, tuple[str, bytes]] | None = None
) -> dict[str, Any]:
    """The request's parameters: a JSON object, or form fields (urlencoded or multipart).

    Like LibreTranslate's ``request.values``, query-string parameters count for forms.
    A form field given several times (``q=a&q=b``) is its first value, as LibreTranslate's
    ``request.values.get`` reads it (a list ``q`` comes as JSON). Uploaded files go to
    `files` (name → (filename, content)) when it is given.

    Raises:
        ApiError: 413 over `max_body_bytes`; 400 malformed JSON, not a JSON object, or a
            string with a lone surrogate (`check_unicode`).
    """
    body = await read_body(request, max_body_bytes)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        data = _json_object(body)
        check_unicode(data)
        return data
    params: dict[str, Any] = {}
    for key, value in urllib.parse.parse_qsl(request.url.query, keep_blank_values=True):
        params[key] = value
    if ctype in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await Request(request.scope, receive=_replay(body)).form()
        for key in form:
            values = [v for v in form.getlist(key) if isinstance(v, str)]
            if values:
                params[key] = values[0]  # q=a&q=b: the first, as werkzeug's .get
            upload = form.get(key)
            if files is not None and not isinstance(upload, str) and upload is not None:
                files[key] = (upload.filename or "", await upload.read())
    check_unicode(params)
    return params


def request_texts(
    params: dict[str, Any], settings: ServeConfig, is_json: bool
) -> tuple[list[str], bool]:
    """(the texts of ``q``, whether ``q`` was a list), checked against the request limits.

    Raises:
        ApiError: 400 no ``q`` or not strings; 413 over ``max_texts``, ``max_chars``,
            ``max_text_chars`` or ``max_lines``.
    """
    q = params.get("q")
    if not q:
        raise ApiError(400, "Invalid request: missing q parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    if not is_json:  # LibreTranslate normalises form line endings to LF
        texts = ["\n".join(t.splitlines()) for t in texts]
    if len(texts) > settings.max_texts:
        raise ApiError(
            413,
            f"Invalid request: request ({len(texts)} texts) exceeds text limit ({settings.max_texts})",
        )
    chars = sum(len(t) for t in texts)
    if chars > settings.max_chars:
        raise ApiError(
            413, f"Invalid request: request ({chars}) exceeds text limit ({settings.max_chars})"
        )
    for i, text in enumerate(texts):
        if len(text) > settings.max_text_chars:
            raise ApiError(
                413,
                f"Invalid request: text {i} has {len(text)} characters, over the limit "
                f"(max_text_chars={settings.max_text_chars})",
            )
        lines = text.count("\n") + 1
        if lines > settings.max_lines:
            raise ApiError(
                413,
                f"Invalid request: text {i} has {lines} lines, over the limit "
                f"(max_lines={settings.max_lines})",
            )
    return texts, batch


__all__ = ["check_unicode", "read_body", "read_params", "request_texts"]
