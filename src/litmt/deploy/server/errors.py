"""The server's errors: an HTTP status and a one-line message for the client, as
LibreTranslate answers them (``{"error": message}``). A 500 tells the client only an error
id; the detail (exception, traceback) goes to the server's log under the same id
(`internal_error`)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An HTTP error answered as ``{"error": message}`` with `status` (and `headers`, e.g.
    a 503's ``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def internal_error(what: str, exc: BaseException) -> ApiError:
    """The 500 of a failure (`what` failed with `exc`): ``{"error": "internal error, id
    ID"}`` for the client, nothing of the exception (paths, device text); the server's log
    gets one record with the same ID, the exception and its traceback."""
    error_id = secrets.token_hex(6)
    log.error(
        "internal error, id %s: %s: %s: %s",
        error_id,
        what,
        type(exc).__name__,
        exc,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return ApiError(500, f"internal error, id {error_id}")


def install_error_handlers(app: Any) -> None:
    """Every error of `app` as ``{"error": message}``: `ApiError` with its status, Starlette's
    (404, 405) with theirs, a malformed request 400, a `LitmtError` (the user's mistake) 400
    with its first line, anything else 500 with an error id only (`internal_error`)."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from litmt.errors import LitmtError

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": f"Invalid request: {exc.errors()}"}, status_code=400)

    @app.exception_handler(LitmtError)
    async def _user_error(request: Request, exc: LitmtError) -> JSONResponse:
        return JSONResponse({"error": str(exc).splitlines()[0]}, status_code=400)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        error = internal_error(f"{request.method} {request.url.path}", exc)
        return JSONResponse({"error": error.message}, status_code=500)


__all__ = ["ApiError", "install_error_handlers", "internal_error"]
