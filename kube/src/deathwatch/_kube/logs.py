"""Logs, for every deathwatch process: structlog JSON key-values on stderr, one object per
line, the standard library's loggers (kopf's, prometheus_client's HTTP server) rendered the
same way. `quiet`: loggers held at a floor (a library's per-call chatter)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

import structlog


def configure(level: str = "info", quiet: Mapping[str, int] | None = None) -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for name, floor in (quiet or {}).items():
        logging.getLogger(name).setLevel(max(numeric, floor))
