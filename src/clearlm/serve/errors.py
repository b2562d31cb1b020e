"""Errors as the OpenAI API writes them: ``{"error": {"message", "type", "param", "code"}}``.

Every refusal of the server, from a body that is not JSON to an unknown route, has this shape,
so the official client raises its typed exceptions (``BadRequestError`` for 400,
``AuthenticationError`` for 401, ``NotFoundError`` for 404) with the message shown.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from clearlm.errors import ClearLMError, ContextLengthError

INVALID = "invalid_request_error"


class APIError(Exception):
    """A request the server refuses.

    Args:
        status: HTTP status (400 bad input, 401 no or wrong key, 404 unknown route or model).
        message: one line saying what is wrong and what to do.
        param: the request field at fault (``"messages.0.content"``), or None.
        code: a short machine-readable reason (``"model_not_found"``), or None.
        type: OpenAI's error type; ``invalid_request_error`` for every client mistake.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_clearlm(e: ClearLMError, param: str | None = None, code: str | None = None) -> APIError:
    """A ClearLMError raised while preparing a request (a bad setting, a prompt longer than the
    context, a chat template that fails) as a 400; ``code`` (default: from the error's class)
    when the caller knows better."""
    if code is None:
        code = "context_length_exceeded" if isinstance(e, ContextLengthError) else "invalid_value"
    return APIError(400, str(e), param, code)
