"""Validation of lexical requests: every rejection names the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from attest.common.v1 import common_pb2
from attest.core.errors import InvalidArgument
from attest.core.settings import RequestLimits
from attest.lexical import convert
from attest.lexical.models import Level
from attest.lexical.v1 import lexical_pb2

LIMITS = RequestLimits()


def search(**kw: object) -> lexical_pb2.SearchRequest:
    base: dict[str, object] = {"query": "water use", "top_k": 10}
    base.update(kw)
    return lexical_pb2.SearchRequest(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "field", "reason"),
    [
        (search(query=""), "query", "must not be empty"),
        (search(query="   \n"), "query", "must not be empty"),
        (search(query="x" * 10_000), "query", "10,000 characters; the limit is 4,096"),
        (search(top_k=0), "top_k", "between 1 and 1000, got 0"),
        (search(top_k=1001), "top_k", "between 1 and 1000, got 1001"),
        (search(top_k=-3), "top_k", "got -3"),
        (
            search(filters=[common_pb2.Filter(field="colour", any_of=["red"])]),
            "filters[0].field",
            "unknown filter field 'colour'",
        ),
        (
            search(filters=[common_pb2.Filter(field="published_at", gte="31/12/2024")]),
            "filters[0].gte",
            "not an ISO-8601 date",
        ),
        (
            search(
                filters=[
                    common_pb2.Filter(field="organization", any_of=["A"]),
                    common_pb2.Filter(field="published_at", lte="2024-13-01"),
                ]
            ),
            "filters[1].lte",
            "not an ISO-8601 date",
        ),
        (
            search(
                filters=[
                    common_pb2.Filter(field="published_at", gte="2025-01-02", lte="2025-01-01")
                ]
            ),
            "filters",
            "date range is empty",
        ),
        (search(filters=[common_pb2.Filter(field="entity")]), "filters[0].any_of", "at least one"),
        (search(level=7), "level", "unknown level"),
    ],
)
def test_search_rejections_name_the_field(request_, field, reason):
    with pytest.raises(InvalidArgument) as info:
        convert.search_from_proto(request_, LIMITS)
    assert info.value.field == field
    assert reason in info.value.message
    assert info.value.details.startswith(f"{field}: ")


def test_search_conversion_keeps_filters_and_level():
    query = convert.search_from_proto(
        search(
            level=lexical_pb2.SEARCH_LEVEL_PASSAGE,
            highlight=True,
            filters=[
                common_pb2.Filter(field="organization", any_of=["Norvale Copper", "Brightwater"]),
                common_pb2.Filter(
                    field="published_at", gte="2025-01-01", lte="2025-06-30T12:00:00Z"
                ),
                common_pb2.Filter(field="entity", any_of=["gri-303"]),
            ],
        ),
        LIMITS,
    )
    assert query.level is Level.PASSAGE
    assert query.highlight
    assert query.filters.organizations == ("Norvale Copper", "Brightwater")
    assert query.filters.entity_ids == ("gri-303",)
    assert query.filters.published_from == datetime(2025, 1, 1, tzinfo=UTC)
    assert query.filters.published_to == datetime(2025, 6, 30, 12, tzinfo=UTC)


def test_two_filters_on_one_field_intersect():
    query = convert.search_from_proto(
        search(
            filters=[
                common_pb2.Filter(field="organization", any_of=["A", "B"]),
                common_pb2.Filter(field="organization", any_of=["b", "C"]),
            ]
        ),
        LIMITS,
    )
    assert query.filters.organizations == ("B",)


def doc(**kw: object) -> common_pb2.Document:
    base: dict[str, object] = {"id": "d1", "title": "t", "body": "b"}
    base.update(kw)
    return common_pb2.Document(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("documents", "field", "reason"),
    [
        ([], "documents", "at least one"),
        ([doc(), doc(id="")], "documents[1].id", "must not be empty"),
        ([doc(id="x" * 300)], "documents[0].id", "longer than 256"),
        ([doc(title="", body="")], "documents[0]", "needs a title, a body or passages"),
        ([doc(), doc()], "documents", "appears twice"),
        (
            [
                doc(
                    passages=[
                        common_pb2.Passage(index=0, text="a"),
                        common_pb2.Passage(index=2, text="b"),
                    ]
                )
            ],
            "documents[0].passages",
            "without gaps",
        ),
        (
            [doc(passages=[common_pb2.Passage(doc_id="other", index=0, text="a")])],
            "documents[0].passages[0].doc_id",
            "belongs to document 'other'",
        ),
    ],
)
def test_index_rejections_name_the_field(documents, field, reason):
    with pytest.raises(InvalidArgument) as info:
        convert.index_from_proto(lexical_pb2.IndexRequest(documents=documents), LIMITS)
    assert info.value.field == field
    assert reason in info.value.message


def test_batch_limit_is_enforced():
    limits = RequestLimits(max_batch=2)
    with pytest.raises(InvalidArgument) as info:
        convert.index_from_proto(
            lexical_pb2.IndexRequest(documents=[doc(id=str(i)) for i in range(3)]), limits
        )
    assert info.value.field == "documents"
    assert "the limit is 2" in info.value.message


def test_delete_rejects_empty_ids():
    with pytest.raises(InvalidArgument) as info:
        convert.delete_from_proto(lexical_pb2.DeleteRequest(doc_ids=["a", " "]), LIMITS)
    assert info.value.field == "doc_ids[1]"
