"""The API's one error type, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 err_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(e: ValueError) -> ApiError:
    msg = str(e)
    head = msg.split(" ", 1)[0].rstrip(":")
    param = head.split(".", 1)[1] if head.startswith("sampling_params.") else head.split(".")[0]
    return ApiError(400, msg, param=param)
