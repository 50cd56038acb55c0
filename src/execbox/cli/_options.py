"""Options several commands share."""

from __future__ import annotations

from enum import StrEnum

import typer


class LogLevel(StrEnum):
    """uvicorn's log levels (uvicorn.config.LOG_LEVELS): any other value was a KeyError traceback."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"
    trace = "trace"


LOG_LEVEL = typer.Option(LogLevel.info, "--log-level", case_sensitive=False, help="uvicorn log level.")
