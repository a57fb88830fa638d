"""RFC 3339 timestamps as the Kubernetes API writes them, to and from aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["UTC", "format_time", "parse_time"]


def parse_time(value: object) -> datetime | None:
    """Parse an API timestamp ("2026-11-29T10:00:02Z", MicroTime with fractions too).

    Returns None for anything that is not a well-formed timestamp string; callers decide
    whether a missing time is an error. Naive results are taken as UTC, as the API means.
    """
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed


def format_time(value: datetime | None) -> str | None:
    """Format as RFC 3339 UTC with a Z, seconds precision unless there are microseconds."""
    if value is None:
        return None
    value = value.astimezone(UTC)
    text = value.isoformat(timespec="microseconds" if value.microsecond else "seconds")
    return text.replace("+00:00", "Z")
