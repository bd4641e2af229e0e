"""Logging: a library logs through the standard :mod:`logging` machinery; the CLI renders it.

Every kernel and plugin logger comes from :func:`get_logger` (``ctxkernel.get_logger``): a
structlog logger over ``logging.getLogger("ctxkernel.<part>")``. So, used as a library,
ctxkernel prints nothing of its own: the application's logging configuration decides what is
shown and where (``logging.basicConfig(level=logging.DEBUG)`` shows the kernel's debug records);
unconfigured, nothing is shown at all (the ``ctxkernel`` logger holds a ``NullHandler``, so
Python's last-resort handler never prints a kernel warning). Nothing ever goes to stdout, which
belongs to the application (a stdio protocol server breaks on a stray line).

Event dicts are shaped by structlog's configured processors when the application (or
:func:`structlog.testing.capture_logs`) has configured structlog, and otherwise by this module's
own chain, which renders ``event key=value ...`` into the record's message. Either way the
record goes to the stdlib logger.

The ``ctxkernel`` command calls :func:`configure_logging`: with ``--log-level``, a stderr handler
on the root logger and the ``ctxkernel`` loggers at that level, one readable text line a record
(colored on a terminal); without it, no log line at all. Every field of every line, tracebacks
included, passes through :func:`ctxkernel.redact.structlog_processor` first.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from .redact import structlog_processor

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ROOT = "ctxkernel"
#: a library's log records go nowhere until the application configures logging (not even
#: Python's last-resort handler on stderr, which prints warnings of unconfigured libraries)
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def _render_for_stdlib(_: Any, __: str, event_dict: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The last processor when structlog is unconfigured: one readable message for any handler
    (``session created session='…'``), the traceback (already formatted and redacted by the
    redaction processor) on the lines after it."""
    kwargs: dict[str, Any] = {key: event_dict.pop(key) for key in ("exc_info", "stack_info") if key in event_dict}
    event = str(event_dict.pop("event", ""))
    traceback = event_dict.pop("exception", None)
    fields = " ".join(f"{key}={_short_repr(value)}" for key, value in event_dict.items())
    message = f"{event} {fields}" if fields else event
    if isinstance(traceback, str) and traceback:
        message += "\n" + traceback
    return (message,), kwargs


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a log line never fails on a value it cannot print
        return f"<{type(value).__name__}>"
    return text if len(text) <= 2_000 else text[:1_999] + "…"


#: the chain used while structlog is unconfigured; the level check comes first, so a debug call
#: under an application that shows warnings costs one ``isEnabledFor``; then no field (nor a
#: traceback) carries a credential
_LIBRARY_PROCESSORS: list[Any] = [structlog.stdlib.filter_by_level, structlog_processor, _render_for_stdlib]


class LibraryLogger(structlog.stdlib.BoundLogger):
    """A stdlib-backed structlog logger: the configured processors if structlog is configured
    (by the application, the CLI or ``capture_logs``), this module's chain otherwise."""

    def __init__(self, logger: Any, processors: Any, context: Any) -> None:
        super().__init__(logger, processors if structlog.is_configured() else _LIBRARY_PROCESSORS, context)


def get_logger(name: str) -> Any:
    """The logger for ``name`` (use ``ctxkernel.<part>``, e.g. ``ctxkernel.decay``), logging
    through ``logging.getLogger(name)``. Call it with structlog's API:
    ``log.info("event", key=value)``, ``log.error("event", exc_info=True)``."""
    # a lazy proxy: processors are looked up per call, so configure_logging and capture_logs
    # take effect on loggers made at import time
    return structlog.wrap_logger(logging.getLogger(name), wrapper_class=LibraryLogger)


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is at the time of the record, not when it was made: a
    replaced or closed stream (pytest's capture, a daemon's redirect) must not break later logs."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(level: str | None = "warning") -> None:
    """The CLI's logging: ctxkernel's records at ``level`` and above to stderr, one text line a
    record (colored on a terminal); ``None``: no log line at all (the command's default). Calling
    it again replaces the set-up."""
    if level is None:
        reset_logging()
        return
    if level not in _LEVELS:
        msg = f"log level must be one of {list(_LEVELS)}, got {level!r}"
        raise SystemExit(msg)
    tty = sys.stderr.isatty()
    # the console renderer prints tracebacks itself (plain text off a terminal)
    renderer = [structlog.dev.ConsoleRenderer(colors=tty)]
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.processors.add_log_level,
            stamp,
            # last before rendering: no field of any log line carries a credential
            structlog_processor,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *renderer,
            ],
            # records from plain stdlib loggers get the same fields, redacted too
            foreign_pre_chain=[structlog.processors.add_log_level, stamp, structlog_processor],
        )
    )
    handler._ctxkernel_cli = True  # type: ignore[attr-defined]  # found and replaced by the next call
    # the command is the application: its handler sits on the root logger, so every record at
    # the chosen level reaches stderr; other libraries stay at warning (a debug run shows the
    # kernel's records, not every file lock's)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ctxkernel_cli", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(_LEVELS[level], logging.WARNING))
    logging.getLogger(ROOT).setLevel(_LEVELS[level])


def reset_logging() -> None:
    """Undo :func:`configure_logging` (tests): structlog's defaults, no CLI handler, no levels."""
    structlog.reset_defaults()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ctxkernel_cli", False)]:
        root.removeHandler(old)
    root.setLevel(logging.WARNING)
    logging.getLogger(ROOT).setLevel(logging.NOTSET)


__all__ = ["LibraryLogger", "configure_logging", "get_logger", "reset_logging"]
