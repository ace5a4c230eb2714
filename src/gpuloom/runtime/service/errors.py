"""What the service refuses, as exceptions the API turns into answers (422, 403, 404)."""

from __future__ import annotations


class SubmitError(ValueError):
    """A job the service refuses; ``field`` names the offending field when there is one."""

    def __init__(self, msg: str, field: str | None = None, kind: str = "never_fits") -> None:
        super().__init__(msg)
        self.field = field
        self.kind = kind  # the 422's ``type``


class PermissionDenied(PermissionError):
    pass


class NotFound(KeyError):
    pass
