"""Checks of the values a row is made of (strings, numbers, times), shared by every table's writer."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from epilab.db.models import (
    CONTROL_CHARS,
    DETAIL_LEN,
)


def now() -> datetime:
    return datetime.now(timezone.utc)


def check_str(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str) or not value or len(value) > limit or CONTROL_CHARS.search(value):
        raise ValueError(
            f"{name} must be a non-empty string of at most {limit} printable characters, got {value!r:.80}"
        )
    return value


def clean_detail(detail: str) -> str:
    """A failure's text (a compiler's message, a traceback) as stored: its start, with lines
    and tabs kept and every other control character (a colour code, an escape) replaced."""
    return CONTROL_CHARS.sub(
        lambda m: m[0] if m[0] in "\n\t" else "\N{REPLACEMENT CHARACTER}", detail[:DETAIL_LEN]
    )


def check_num(name: str, value: object, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except OverflowError:  # an int beyond float's range
        number = None
    if number is None or not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r:.80}")
    return number


def aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)
