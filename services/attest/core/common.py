"""Conversion of the shared ``attest.common.v1`` messages: filters and times.

Filters are combined with AND, the values of one filter with OR. Every
rejection names the field as the caller wrote it (``filters[1].gte``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.core.document import BY_FILTER, HasKeywords, Keywords
from attest.core.errors import InvalidArgument
from attest.core.validation import check_enum, check_id, datetime_from_timestamp, parse_date

DATE_FILTER = "published_at"
# Restricts a search to named documents (their passages too): the id a
# document was ingested under, compared exactly.
DOC_FILTER = "doc_id"
FILTER_FIELDS = (*BY_FILTER, DOC_FILTER, DATE_FILTER)
NO_MATCH = "\x00no-match"


@dataclass(frozen=True, slots=True)
class Filters(HasKeywords):
    """Conjunctive restrictions; no values and None mean "no restriction".

    ``keywords`` maps a keyword field's name (``attest.core.document``) to the
    values a record must have at least one of; ``doc_ids``, when not empty,
    the documents a record must belong to.
    """

    keywords: Keywords = field(default_factory=dict)
    published_from: datetime | None = None
    published_to: datetime | None = None
    doc_ids: tuple[str, ...] = ()

    @property
    def restricts_keywords(self) -> bool:
        return any(self.keywords.values())

    @property
    def restricts(self) -> bool:
        """Whether anything beyond the tenant is restricted."""
        return bool(
            self.restricts_keywords or self.doc_ids or self.published_from or self.published_to
        )


def filters_from_proto(
    filters: Sequence[common_pb2.Filter], *, max_filters: int, max_values: int
) -> Filters:
    if len(filters) > max_filters:
        raise InvalidArgument(f"at most {max_filters} filters are allowed", field="filters")
    keywords: dict[str, list[str]] = {}
    doc_ids: list[str] | None = None
    published_from: datetime | None = None
    published_to: datetime | None = None
    for i, f in enumerate(filters):
        where = f"filters[{i}]"
        if f.field not in FILTER_FIELDS:
            raise InvalidArgument(
                f"unknown filter field {f.field[:64]!r}; "
                f"expected one of {', '.join(FILTER_FIELDS)}",
                field=f"{where}.field",
            )
        if f.field == DATE_FILTER:
            if f.any_of:
                raise InvalidArgument(
                    "date filters take gte/lte, not any_of", field=f"{where}.any_of"
                )
            if not f.gte and not f.lte:
                raise InvalidArgument("a date filter needs gte, lte or both", field=where)
            if f.gte:
                lower = parse_date(f.gte, f"{where}.gte")
                published_from = lower if published_from is None else max(published_from, lower)
            if f.lte:
                upper = parse_date(f.lte, f"{where}.lte")
                published_to = upper if published_to is None else min(published_to, upper)
            continue
        if f.gte or f.lte:
            raise InvalidArgument(f"{f.field} filters take any_of, not gte/lte", field=where)
        if not f.any_of:
            raise InvalidArgument("needs at least one value", field=f"{where}.any_of")
        if len(f.any_of) > max_values:
            raise InvalidArgument(
                f"at most {max_values} values are allowed", field=f"{where}.any_of"
            )
        for k, value in enumerate(f.any_of):
            if not value.strip():
                # An empty value would silently match nothing.
                raise InvalidArgument("must not be empty", field=f"{where}.any_of[{k}]")
        if f.field == DOC_FILTER:
            # An id no document can have (control characters, white space at
            # either end, too long) would match nothing without a word: refused
            # as ingest refuses it.
            for k, value in enumerate(f.any_of):
                check_id(value, f"{where}.any_of[{k}]")
            ids = list(dict.fromkeys(f.any_of))
            # Two document filters are ANDed: the ids both name.
            named = set(ids)
            doc_ids = ids if doc_ids is None else [d for d in doc_ids if d in named]
            continue
        declared = BY_FILTER[f.field]
        try:
            values = declared.clean(f.any_of)
        except ValueError as err:
            raise InvalidArgument(str(err), field=f"{where}.any_of") from None
        target = keywords.setdefault(declared.name, [])
        if target:
            # Two filters on the same field are ANDed: keep the values both allow.
            allowed = {v.casefold() for v in values}
            target[:] = [v for v in target if v.casefold() in allowed] or [NO_MATCH]
        else:
            target.extend(values)
    if published_from and published_to and published_from > published_to:
        raise InvalidArgument("the date range is empty (gte is after lte)", field="filters")
    return Filters(
        keywords={name: tuple(values) for name, values in keywords.items()},
        published_from=published_from,
        published_to=published_to,
        doc_ids=tuple(doc_ids or [NO_MATCH]) if doc_ids is not None else (),
    )


def ids_only_view(view: int, field: str = "view") -> bool:
    """Whether a search's ``HitView`` asks for ids and scores only (unknown values
    are INVALID_ARGUMENT)."""
    check_enum(view, common_pb2.HitView.values(), field)
    return view == common_pb2.HIT_VIEW_IDS


def from_timestamp(ts: Timestamp, present: bool, field: str = "published_at") -> datetime | None:
    """A publication time as an aware datetime, or None when the field is unset.

    Out-of-range values (``Timestamp(seconds=2**62)``) are INVALID_ARGUMENT
    naming ``field``; callers that know the full path pass it.
    """
    return datetime_from_timestamp(ts, field) if present else None


def to_timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    # Seconds and nanos directly: FromDatetime is slow on the hot path of hits.
    micros = round(value.timestamp() * 1_000_000) if value.tzinfo else None
    if micros is None:
        ts = Timestamp()
        ts.FromDatetime(value)
        return ts
    seconds, rest = divmod(micros, 1_000_000)
    return Timestamp(seconds=seconds, nanos=rest * 1000)
