"""The exception tree of ctxkernel.

Every error the kernel raises derives from :class:`CtxKernelError`::

    CtxKernelError
    ├── ConfigError                 a profile, setting or plugin set-up is wrong
    │   ├── ProfileError            a profile file or key is invalid
    │   └── PluginConflictError     two plugins claim the same strategy or tool name
    ├── StoreError                  the store could not do what was asked
    │   ├── SessionNotFoundError
    │   ├── SessionExistsError
    │   ├── ConflictError           optimistic "expected next seq" check failed
    │   └── CorruptionError         a stored byte is not what the format allows
    ├── EventError                  an event is malformed or breaks a log rule
    │   └── SurfaceError            a surface operation is invalid (citations, range)
    ├── CompactionError             a compaction transaction could not commit
    │   ├── CompactionBusyError     another compaction is open
    │   ├── UnbalancedCutError      a cut would split a tool call from its results
    │   ├── ShrinkCheckError        the checkpoint is not smaller than what it replaces
    │   ├── CacheWaitError          the edit does not pay for the cached prefix it rewrites
    │   └── SurfaceChangedError     the surface changed during the transaction
    ├── ControlError                a manual control was refused (unknown action or strategy)
    │   └── SessionBusyError        asked while the session is mid-step
    ├── ToolError                   a tool definition or call is invalid
    └── ModelError                  a model adapter failed
        └── ContextOverflowError    the provider says the request does not fit

Messages name what was wrong, what is accepted and, where there is one, the fix.
"""

from __future__ import annotations


class CtxKernelError(Exception):
    """Base class of every ctxkernel error."""


class ConfigError(CtxKernelError):
    """A profile, a setting or the plugin set-up is wrong."""


class ProfileError(ConfigError):
    """A profile file or one of its keys is invalid."""


class PluginConflictError(ConfigError):
    """Two plugins claim the same strategy name or tool name."""


class HeaderTooLargeError(ConfigError):
    """The request header (system prompt and tool schemas) leaves no room to manage the
    conversation at this window (:func:`ctxkernel.guard.header_refusal`); nothing was written."""

    def __init__(self, message: str, *, header_tokens: int, smallest_window: int) -> None:
        super().__init__(message)
        self.header_tokens = header_tokens
        self.smallest_window = smallest_window


class StoreError(CtxKernelError):
    """The event store could not do what was asked."""


class SessionNotFoundError(StoreError):
    """No session with that id exists in the store."""


class SessionExistsError(StoreError):
    """A session with that id already exists."""


class ConflictError(StoreError):
    """An append was made against a stale view of the log: nothing was written."""

    def __init__(self, session_id: str, expected_seq: int, actual_seq: int) -> None:
        self.session_id = session_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        super().__init__(
            f"session {session_id}: append expected next seq {expected_seq} but the log is at "
            f"{actual_seq}; another writer appended first. Nothing was written: re-read the log "
            "and retry."
        )


class CorruptionError(StoreError):
    """Stored bytes are not what the format allows; nothing was rewritten."""


class EventError(CtxKernelError):
    """An event is malformed or breaks a rule of the log."""


class SurfaceError(EventError):
    """A surface operation is invalid: unknown range, missing citation, bad replacement."""


class CompactionError(CtxKernelError):
    """A compaction transaction could not commit."""


class CompactionBusyError(CompactionError):
    """Another compaction transaction is open on the session."""


class UnbalancedCutError(CompactionError):
    """A cut would separate a tool call from one of its results."""


class ShrinkCheckError(CompactionError):
    """The checkpoint does not cost fewer tokens than what it replaces."""


class CacheWaitError(CompactionError):
    """The prompt cache's break-even rule says wait: the edit saves less than the cached prefix it
    would rewrite costs (``ctxkernel.cache_rule``). Nothing was committed."""

    def __init__(self, message: str, decision: object = None) -> None:
        super().__init__(message)
        self.decision = decision


class SurfaceChangedError(CompactionError):
    """The surface changed between the start and the commit of a transaction."""


class ControlError(CtxKernelError):
    """A manual control (compact now, enable or disable a strategy) was refused: an unknown
    action, a strategy not in the session's profile, or none that handles it."""


class SessionBusyError(ControlError):
    """A manual control (compact now, enable or disable a strategy) was asked for while a model
    request, its tool calls or a compaction are in flight: nothing was written."""


class ToolError(CtxKernelError):
    """A tool definition or a tool call is invalid."""


class ModelError(CtxKernelError):
    """A model adapter failed."""


class ContextOverflowError(ModelError):
    """The provider reports that the request exceeds the model's context window."""

    def __init__(self, message: str, *, prompt_tokens: int | None = None, limit: int | None = None):
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        super().__init__(message)


class RequestTooLargeError(ContextOverflowError):
    """The kernel refused to send a composed request over the effective window: the profile's
    overflow path and the kernel's excerpts could not make it fit (guard.py). Nothing was sent
    and the guard wrote nothing to the log."""
