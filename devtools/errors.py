"""The one error ``devtools`` raises (standard library only, like the rest of its command line)."""


class DevServicesError(RuntimeError):
    """A service or package cannot be provided; the message says why and what to do about it."""
