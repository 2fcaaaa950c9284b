"""One rule per field, shared by every service.

A field that appears in several services (a document id, a publication
time, a date bound, the n of KG path scoring, an enum) is checked here, so
that it is accepted or refused the same way wherever it arrives. Every
rejection is an ``InvalidArgument`` naming the field as the caller wrote it.
Nothing here imports grpc.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TypeGuard

from google.protobuf.timestamp_pb2 import Timestamp

from attest.core.errors import InvalidArgument

# -- request ids -----------------------------------------------------------------

MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_REQUEST_ID_CHARS}}}")


def is_valid_request_id(value: object) -> TypeGuard[str]:
    """Whether a caller's ``x-request-id`` may be used as given (echoed and logged)."""
    return isinstance(value, str) and _REQUEST_ID.fullmatch(value) is not None


# -- text and ids ------------------------------------------------------------------

MAX_ID_CHARS = 256
# Control characters (C0, DEL, C1), zero-width space, line and paragraph
# separators and the byte-order mark: invisible in logs and UIs, so an id
# containing one could pass for another id.
_ID_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b\u2028\u2029\ufeff]")
# Lone surrogates: JSON can spell them (\ud800) but they are not UTF-8, so
# protobuf refuses to serialize them further down the pipeline.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_text(value: str, field: str) -> str:
    """Text must be encodable as UTF-8 (no lone surrogates)."""
    if _SURROGATE.search(value):
        raise InvalidArgument("contains a lone surrogate, which is not valid UTF-8", field=field)
    return value


def has_forbidden_id_chars(value: str) -> bool:
    """Whether an id holds characters that are never shown as they are."""
    return bool(_ID_FORBIDDEN.search(value) or _SURROGATE.search(value))


def check_id(value: str, field: str, max_chars: int = MAX_ID_CHARS) -> str:
    """A document id: 1 to ``max_chars`` characters, not blank, no control
    characters, no white space at either end.

    An id is stored exactly as given, never rewritten: trimming ``" sp1 "`` to
    ``sp1`` would silently replace another document, and a delete of the
    untrimmed id would match nothing. So an id that trimming would change is
    refused instead.
    """
    if not value or not value.strip():
        raise InvalidArgument("must not be empty", field=field)
    if len(value) > max_chars:
        raise InvalidArgument(f"is longer than {max_chars} characters", field=field)
    if _ID_FORBIDDEN.search(value):
        raise InvalidArgument("contains control characters", field=field)
    if value != value.strip():
        raise InvalidArgument(
            f"{value[:60]!r} starts or ends with white space; ids are kept exactly as "
            "given, so remove the white space (or rename the file the id comes from)",
            field=field,
        )
    return check_text(value, field)


# -- numbers and enums ---------------------------------------------------------------


def check_range(value: float, low: float, high: float, field: str) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"must be between {low} and {high}, got {value}", field=field)


def check_enum(value: int, known: Iterable[int], field: str) -> int:
    """A proto3 enum value the server knows, given ``Enum.values()`` (proto3 keeps
    unknown numbers, so the decoder lets them through)."""
    if value not in set(known):
        raise InvalidArgument(f"unknown value {value}", field=field)
    return value


#: The n of KG path scoring (node scores after the best one that are averaged).
KG_TOP_N_MAX = 50


def check_kg_top_n(value: int, field: str = "kg_top_n") -> int:
    if not 0 <= value <= KG_TOP_N_MAX:
        raise InvalidArgument(f"must be between 0 and {KG_TOP_N_MAX}, got {value}", field=field)
    return value


# -- times -----------------------------------------------------------------------------

# A publication time must be storable by every backend: tantivy keeps dates as
# signed 64-bit nanoseconds since 1970, which spans 1677-09-21 to 2262-04-11.
EARLIEST_PUBLISHED = datetime(1678, 1, 1, tzinfo=UTC)
LATEST_PUBLISHED = datetime(2261, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
_PUBLISHED_RANGE = "between 1678-01-01 and 2261-12-31 (UTC)"
MAX_DATE_CHARS = 64


def check_published(value: datetime, field: str) -> datetime:
    """A publication time inside the range every store can hold, in UTC."""
    utc = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if not EARLIEST_PUBLISHED <= utc <= LATEST_PUBLISHED:
        raise InvalidArgument(f"must be {_PUBLISHED_RANGE}", field=field)
    return utc


def datetime_from_timestamp(ts: Timestamp, field: str) -> datetime:
    """A ``google.protobuf.Timestamp`` publication time as an aware UTC datetime."""
    if not 0 <= ts.nanos <= 999_999_999:
        raise InvalidArgument("nanos must be between 0 and 999,999,999", field=field)
    earliest = int(EARLIEST_PUBLISHED.timestamp())
    latest = int(LATEST_PUBLISHED.timestamp())
    if not earliest <= ts.seconds <= latest:
        raise InvalidArgument(f"must be {_PUBLISHED_RANGE}", field=field)
    return ts.ToDatetime(tzinfo=UTC)


def parse_date(value: str, field: str) -> datetime:
    """An ISO-8601 date or date-time as an aware UTC datetime; naive values are UTC."""
    text = value.strip()
    if len(text) > MAX_DATE_CHARS:
        raise InvalidArgument(
            f"is {len(text):,} characters; a date has at most {MAX_DATE_CHARS}", field=field
        )
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            f"{text[:40]!r} is not an ISO-8601 date such as 2024-05-31 or 2024-05-31T12:00:00Z",
            field=field,
        ) from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # 0001-01-01T00:00:00+14:00 is in year 0 in UTC, which datetime cannot hold.
        raise InvalidArgument("falls outside the years 1-9999 in UTC", field=field) from None


# -- JSON ------------------------------------------------------------------------------

MAX_JSON_DEPTH = 32
MAX_JSON_NUMBER_DIGITS = 64


class _NumberTooLong(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text) > MAX_JSON_NUMBER_DIGITS:
        raise _NumberTooLong(text[:20])
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_JSON_NUMBER_DIGITS:
        raise _NumberTooLong(text[:20])
    return float(text)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def loads_json(text: str, field: str) -> Any:
    """Parse JSON with bounded nesting and number sizes.

    ``json.loads`` alone raises RecursionError on deep nesting and ValueError
    on integers of more than 4,300 digits, neither of them a JSONDecodeError.
    """
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float)
    except _NumberTooLong:
        raise InvalidArgument(
            f"has a number of more than {MAX_JSON_NUMBER_DIGITS} digits", field=field
        ) from None
    except RecursionError:
        raise InvalidArgument(
            f"is nested deeper than {MAX_JSON_DEPTH} levels", field=field
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"is malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", field=field
        ) from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise InvalidArgument(f"is nested deeper than {MAX_JSON_DEPTH} levels", field=field)
    return data
