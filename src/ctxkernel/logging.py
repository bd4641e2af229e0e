"""structlog set-up: JSON lines when stderr is not a terminal, readable lines when it is."""

from __future__ import annotations

import logging
import sys

import structlog

from .redact import structlog_processor

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "warning") -> None:
    if level not in _LEVELS:
        msg = f"log level must be one of {list(_LEVELS)}, got {level!r}"
        raise SystemExit(msg)
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # last before rendering: no field of any log line carries a credential
            structlog_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # look sys.stderr up when a logger is made, not now: a replaced or closed stream (pytest's
        # capture, a daemon's redirect) must not break every later log call in the process
        logger_factory=lambda *args: structlog.PrintLogger(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
