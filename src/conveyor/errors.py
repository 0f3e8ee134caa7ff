"""The one error tree of conveyor.

    ConveyorError                 root; every error has a stable ``code``
    ├── UserError                 bad input from the user: the message says what to do
    │   ├── TargetError           TARGET (file.py:name / module:name) cannot be loaded
    │   ├── PipelineError         a broken pipeline declaration or graph
    │   ├── InputError            unreadable input path or manifest line
    │   ├── UrlError              a --db / --blobs URL that no backend understands
    │   ├── ProviderUnavailable   stages call a model and no provider is configured
    │   ├── NotFound              a run, task, job or dead letter that does not exist
    │   │   └── StoreMissing      a read-only command found no store at all
    │   ├── Conflict              a request that contradicts an earlier one (an Idempotency-Key reused)
    │   ├── StateConflict         the thing is past the state the request needs (a review decided already)
    │   ├── TooLarge              a body or document over its size limit
    │   └── Unauthorized          no API token, or one that is not valid (Forbidden: revoked)
    ├── StoreError                the database refused or lost something
    │   └── BackendUnavailable    the database cannot be reached
    ├── Interrupted               Ctrl-C or SIGTERM stopped a run that exists: it can be resumed (``run_id``)
    ├── BlobError                 the blob store refused or lost something
    │   ├── BlobUnwritable        the blob store's folder cannot be written (also a UserError)
    │   ├── BlobUnavailable       the S3 store cannot be reached or refused the request (also a UserError)
    │   ├── BlobNotFound          no blob under that digest
    │   ├── BlobTooLarge          a blob over the size a read allows
    │   └── BlobCorrupt           the stored bytes do not match their digest
    └── StageSignal               raised *by stage code* to steer the runtime
        ├── RetryLater            retry this task at a given time (``after`` seconds)
        └── TerminalError         fail this task now, never retry

The CLI prints ``str(error)`` of a ``UserError`` as one line and exits 2.
"""

from __future__ import annotations

from conveyor.retry_after import sane_delay


class ConveyorError(Exception):
    """Root of every error conveyor raises on purpose."""

    code = "conveyor_error"


class UserError(ConveyorError):
    code = "user_error"


class TargetError(UserError):
    code = "bad_target"


class PipelineError(UserError):
    code = "bad_pipeline"


class InputError(UserError):
    code = "bad_input"


class UrlError(UserError):
    code = "bad_url"


class ProviderUnavailable(UserError):
    code = "provider_unavailable"


class NotFound(UserError):
    code = "not_found"


class StoreMissing(NotFound):
    code = "store_missing"


class Conflict(UserError):
    code = "conflict"


class StateConflict(UserError):
    code = "state_conflict"


class TooLarge(UserError):
    code = "too_large"


class Unauthorized(UserError):
    code = "unauthorized"


class Forbidden(Unauthorized):
    code = "forbidden"


class StoreError(ConveyorError):
    code = "store_error"


class BackendUnavailable(StoreError, UserError):
    code = "backend_unavailable"


class Interrupted(ConveyorError):
    """Ctrl-C or SIGTERM stopped a run that exists: its workers finished or released their tasks, and it can be
    resumed (``run_id``; ``conveyor resume RUN``, or ``Run.resume()`` from Python). ``hint``: how to resume it,
    said after the message."""

    code = "interrupted"

    def __init__(self, run_id: str, hint: str | None = None) -> None:
        self.run_id = run_id
        self.hint = hint
        said = f"run {run_id} was interrupted"
        super().__init__(f"{said}; it is not finished: resume it with {hint}" if hint else said)


class BlobError(ConveyorError):
    code = "blob_error"


class BlobUnwritable(BlobError, UserError):
    code = "blob_unwritable"


class BlobUnavailable(BlobError, UserError):
    """The object store did not answer or refused (after the client's own retries).

    A stage that meets it is retried like any transient failure: it says so through
    ``error_class`` and ``retryable``, which the runtime's classifier takes at their word; the
    CLI prints it as one line (exit 2).
    """

    code = "blob_unavailable"
    error_class = "blob_unavailable"
    retryable = True
    http_status = 503  # the HTTP API answers it as the store being away, not as a bad request


class BlobNotFound(BlobError):
    code = "blob_not_found"


class BlobTooLarge(BlobError):
    code = "blob_too_large"


class BlobCorrupt(BlobError):
    code = "blob_corrupt"


class StageSignal(ConveyorError):
    code = "stage_signal"


class RetryLater(StageSignal):
    """Ask the runtime to run this task again ``after`` seconds from now.

    Counts as an attempt, so a stage that always asks for later still ends
    on the dead-letter list after ``max_attempts``. ``after`` is a finite
    number >= 0; a wait longer than a day is cut to a day::

        if job.status == "pending":
            raise RetryLater(after=30, reason="batch job still running")
    """

    code = "retry_later"

    def __init__(self, after: float, reason: str = "") -> None:
        delay = sane_delay(after) if isinstance(after, (int, float)) else None
        if delay is None:
            raise ValueError(f"RetryLater(after=...) must be a finite number of seconds >= 0, not {after!r}")
        self.after = delay
        self.reason = reason
        super().__init__(reason or f"retry requested in {delay:g}s")


class TerminalError(StageSignal):
    """Fail this task at once; retrying cannot help (bad document, refused content)."""

    code = "terminal"

    def __init__(self, message: str, error_class: str = "terminal") -> None:
        self.error_class = error_class
        super().__init__(message)
