"""The one error type the CLI turns into a one-line message and a non-zero exit."""


class TandemError(Exception):
    """A user-facing failure: bad input, a missing artifact, a VM that did not behave.

    The message is one line and names the culprit (file, offset, flag, VM).
    """

    exit_code = 2


class BundleError(TandemError):
    """A recording bundle is missing, corrupt, truncated or does not match this build."""

