"""The server's error: an HTTP status and a one-line message for the client."""

from __future__ import annotations


class ApiError(Exception):
    """An HTTP error answered as ``{"error": message}`` with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message
