"""The shared validation layer: one rule per field, used by every service (no sockets)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.core import common, validation
from attest.core.errors import InvalidArgument
from attest.core.interceptors import Undecodable, _request_id, lenient
from attest.core.settings import RequestLimits
from attest.ingest import convert as ingest_convert
from attest.ingest.documents import FailureCode, ItemError, article_from_raw_json
from attest.ingest.settings import IngestLimits
from attest.ingest.v1 import ingest_pb2
from attest.lexical import convert as lexical_convert
from attest.lexical import query as q
from attest.lexical.backends.tantivy import TantivyBackend, _mark
from attest.lexical.models import DocumentIn, Filters, SearchQuery
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.v1 import semantic_pb2


def field_of(call: Any, *args: Any) -> str | None:
    with pytest.raises(InvalidArgument) as info:
        call(*args)
    return info.value.field


# -- undecodable requests --------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\x02\xff\xfe",  # field 1, a string of invalid UTF-8
        b"\x08\xff",  # a truncated varint
        b"\x0f",  # wire type 7 does not exist
        b"\x0a\x7f",  # a length past the end
        bytes(range(7, 40)),  # noise
    ],
)
def test_undecodable_bytes_become_invalid_argument_naming_the_type(raw):
    deserialize = lenient(lexical_pb2.SearchRequest.FromString)
    assert deserialize is not None
    marker = deserialize(raw)
    assert isinstance(marker, Undecodable)
    error = marker.error()
    assert error.code == "INVALID_ARGUMENT"
    assert error.field == "request"
    assert "attest.lexical.v1.SearchRequest" in error.details
    assert "DecodeError" not in error.details
    assert "Unexpected" not in error.details


def test_decodable_bytes_pass_through():
    deserialize = lenient(lexical_pb2.SearchRequest.FromString)
    assert deserialize is not None
    request = lexical_pb2.SearchRequest(query="water", top_k=3)
    assert deserialize(request.SerializeToString()) == request
    assert lenient(None) is None


# -- request ids ---------------------------------------------------------------------


def test_request_ids_are_kept_only_when_short_and_plain():
    assert _request_id({"x-request-id": "abc-123_x.y:z"}) == "abc-123_x.y:z"
    for bad in ("x" * 3007, "x" * 129, "", "a b", "a\nb", "ü", "<script>"):
        fresh = _request_id({"x-request-id": bad})
        assert fresh != bad
        assert validation.is_valid_request_id(fresh)
    assert validation.is_valid_request_id(_request_id({}))
    assert validation.is_valid_request_id("x" * 128)


# -- ids: one rule in lexical, semantic and ingest ------------------------------------


@pytest.mark.parametrize("bad", ["a\x00b", "a\tb", "a\nb", "\x7f", "a\u200bb", "a\ufeff"])
def test_an_id_with_control_characters_is_refused_everywhere(bad):
    limits = RequestLimits()
    lexical = lexical_pb2.IndexRequest(documents=[common_pb2.Document(id=bad, body="b")])
    assert field_of(lexical_convert.index_from_proto, lexical, limits) == "documents[0].id"
    delete = lexical_pb2.DeleteRequest(doc_ids=["ok", bad])
    assert field_of(lexical_convert.delete_from_proto, delete, limits) == "doc_ids[1]"
    with pytest.raises(ItemError) as info:
        article_from_raw_json(json.dumps({"id": bad, "body": "b"}).encode())
    assert info.value.code is FailureCode.INVALID_ID
    assert info.value.reason.startswith("id: ")


def test_ids_are_bounded_the_same_way():
    assert validation.check_id("x" * 256, "id") == "x" * 256
    assert field_of(validation.check_id, "x" * 257, "doc_id") == "doc_id"
    assert field_of(validation.check_id, "   ", "doc_id") == "doc_id"


# -- times and dates --------------------------------------------------------------------


@pytest.mark.parametrize(
    "ts",
    [
        Timestamp(seconds=2**62),
        Timestamp(seconds=-(2**62)),
        Timestamp(seconds=-1_000_000_000_000),
        Timestamp(seconds=0, nanos=-1),
        Timestamp(seconds=0, nanos=10**9),
    ],
)
def test_out_of_range_timestamps_are_invalid_argument_naming_the_field(ts):
    limits = RequestLimits()
    doc = common_pb2.Document(id="a", body="b", published_at=ts)
    request = lexical_pb2.IndexRequest(documents=[common_pb2.Document(id="ok", body="b"), doc])
    assert (
        field_of(lexical_convert.index_from_proto, request, limits) == "documents[1].published_at"
    )


def test_publication_times_inside_the_range_are_kept():
    ts = Timestamp()
    ts.FromJsonString("1969-07-20T20:17:40Z")
    assert validation.datetime_from_timestamp(ts, "t") == datetime(
        1969, 7, 20, 20, 17, 40, tzinfo=UTC
    )
    edge = Timestamp(seconds=int(validation.LATEST_PUBLISHED.timestamp()))
    assert validation.datetime_from_timestamp(edge, "t").year == 2261


@pytest.mark.parametrize(
    ("gte", "lte", "field"),
    [
        ("0001-01-01T00:00:00+14:00", "", "filters[0].gte"),
        ("", "9999-12-31T23:59:59-14:00", "filters[0].lte"),
        ("1" * 5000, "", "filters[0].gte"),
        ("2025-02-30", "", "filters[0].gte"),
    ],
)
def test_date_bounds_that_overflow_are_invalid_argument(gte, lte, field):
    filters = [common_pb2.Filter(field="published_at", gte=gte, lte=lte)]
    assert (
        field_of(
            lambda: common.filters_from_proto(filters, max_filters=16, max_values=256),
        )
        == field
    )


def test_date_bounds_are_utc_and_the_widest_are_allowed():
    filters = [common_pb2.Filter(field="published_at", gte="0001-01-01", lte="9999-12-31")]
    parsed = common.filters_from_proto(filters, max_filters=16, max_values=256)
    assert parsed.published_from == datetime(1, 1, 1, tzinfo=UTC)
    shifted = [common_pb2.Filter(field="published_at", gte="2025-01-01T02:00:00+02:00")]
    parsed = common.filters_from_proto(shifted, max_filters=16, max_values=256)
    assert parsed.published_from == datetime(2025, 1, 1, tzinfo=UTC)


async def test_tantivy_accepts_the_widest_date_bounds(tmp_path: Path):
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    try:
        doc = DocumentIn(
            id="d", title="water", body="water", published_at=datetime(1969, 1, 1, tzinfo=UTC)
        )
        await backend.index("default", [doc], refresh=True)
        widest = Filters(
            published_from=datetime(1, 1, 1, tzinfo=UTC),
            published_to=datetime(9999, 12, 31, tzinfo=UTC),
        )
        hits = await backend.search("default", SearchQuery(text="water", filters=widest))
        assert [h.doc_id for h in hits] == ["d"]
        beyond = Filters(published_from=datetime(2500, 1, 1, tzinfo=UTC))
        assert await backend.search("default", SearchQuery(text="water", filters=beyond)) == []
    finally:
        await backend.close()


# -- ingest: a bad item fails alone ------------------------------------------------------


def raw_item(data: bytes) -> ingest_pb2.IngestItem:
    return ingest_pb2.IngestItem(raw_json=data, origin="test")


def test_bad_items_fail_alone_with_the_field_named():
    good = raw_item(json.dumps({"id": "good", "body": "A body about water."}).encode())
    bad = {
        "deep": raw_item(b'{"id":"deep","body":"x","n":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        "digits": raw_item(b'{"id":"n","body":"x","published_at":' + b"1" * 5000 + b"}"),
        "digit string": raw_item(b'{"id":"s","body":"x","published_at":"' + b"1" * 5000 + b'"}'),
        "overflow": raw_item(b'{"id":"o","body":"x","published_at":"0001-01-01T00:00:00+14:00"}'),
        "surrogate": raw_item(b'{"id":"u","body":"x \\ud800"}'),
        "timestamp": ingest_pb2.IngestItem(
            document=common_pb2.Document(id="t", body="x", published_at=Timestamp(seconds=2**62))
        ),
        "nul id": ingest_pb2.IngestItem(document=common_pb2.Document(id="a\x00", body="x")),
    }
    items = ingest_convert.items_from_proto([good, *bad.values(), good], IngestLimits())
    assert items[0].error is None
    assert items[-1].error is None
    assert items[0].article is not None
    assert items[0].article.id == "good"
    reasons = {}
    for name, item in zip(bad, items[1:-1], strict=True):
        assert item.error is not None, name
        reasons[name] = (item.error.code, item.error.reason)
    assert reasons["deep"] == (
        FailureCode.INVALID_JSON,
        "raw_json: is nested deeper than 32 levels",
    )
    assert reasons["digits"][0] is FailureCode.INVALID_JSON
    assert "more than 64 digits" in reasons["digits"][1]
    assert reasons["digit string"][0] is FailureCode.INVALID_DATE
    assert reasons["overflow"] == (
        FailureCode.INVALID_DATE,
        "published_at: falls outside the years 1-9999 in UTC",
    )
    assert reasons["surrogate"][0] is FailureCode.INVALID_UTF8
    assert reasons["surrogate"][1].startswith("body: ")
    assert reasons["timestamp"][0] is FailureCode.INVALID_DATE
    assert reasons["timestamp"][1].startswith("published_at: ")
    assert reasons["nul id"][0] is FailureCode.INVALID_ID


def test_json_nesting_and_number_limits():
    assert validation.loads_json('{"a": [[1]]}', "raw_json") == {"a": [[1]]}
    deep = "[" * 33 + "]" * 33
    assert field_of(validation.loads_json, deep, "raw_json") == "raw_json"
    validation.loads_json("[" * 32 + "]" * 32, "raw_json")
    assert field_of(validation.loads_json, "1" * 65, "raw_json") == "raw_json"
    assert field_of(validation.loads_json, "1." + "1" * 64, "raw_json") == "raw_json"


def test_ingest_keeps_the_callers_utc_offset():
    article = article_from_raw_json(
        b'{"id":"a","body":"x","published_at":"2024-05-31T12:00:00+02:00"}'
    )
    assert article.published_at is not None
    assert article.published_at.isoformat() == "2024-05-31T12:00:00+02:00"


# -- semantic: the same rules as Ask and Search ------------------------------------------


def semantic() -> SemanticServicer:
    # Validation happens before the index is touched.
    index: Any = SimpleNamespace()
    return SemanticServicer(SemanticSettings(), index=index)


async def rejected_field(call: Any, request: Any) -> str | None:
    with pytest.raises(InvalidArgument) as info:
        await call(request, None)
    return info.value.field


async def test_semantic_search_refuses_an_unknown_fusion_method():
    request = semantic_pb2.SearchRequest(query="water", top_k=3, fusion=99)
    assert await rejected_field(semantic().Search, request) == "fusion"


@pytest.mark.parametrize("n", [-5, -1, 51])
async def test_kg_top_n_has_one_range_in_search_and_explain(n):
    servicer = semantic()
    search = semantic_pb2.SearchRequest(query="water", top_k=3, kg_top_n=n)
    explain = semantic_pb2.ExplainRequest(query="water", doc_id="d", kg_top_n=n)
    assert await rejected_field(servicer.Search, search) == "kg_top_n"
    assert await rejected_field(servicer.Explain, explain) == "kg_top_n"


async def test_semantic_ids_and_times_follow_the_shared_rules():
    servicer = semantic()
    index = semantic_pb2.IndexRequest(
        documents=[semantic_pb2.IndexDocument(document=common_pb2.Document(id="a\x00", body="b"))]
    )
    assert await rejected_field(servicer.Index, index) == "documents[0].document.id"
    late = semantic_pb2.IndexRequest(
        documents=[
            semantic_pb2.IndexDocument(
                document=common_pb2.Document(
                    id="a", body="b", published_at=Timestamp(seconds=2**62)
                )
            )
        ]
    )
    assert await rejected_field(servicer.Index, late) == "documents[0].document.published_at"
    delete = semantic_pb2.DeleteRequest(doc_ids=["a\x00"])
    assert await rejected_field(servicer.Delete, delete) == "doc_ids[0]"
    explain = semantic_pb2.ExplainRequest(query="water", doc_id="d\x00")
    assert await rejected_field(servicer.Explain, explain) == "doc_id"


# -- highlights ----------------------------------------------------------------------------


def test_tantivy_fragments_are_escaped_before_marking():
    fragment = 'Water <script>alert("x")</script> & water'
    raw = fragment.encode()
    spans = [
        SimpleNamespace(start=raw.index(b"script"), end=raw.index(b"script") + 6),
        SimpleNamespace(start=0, end=5),
    ]
    assert _mark(fragment, spans) == (
        "<em>Water</em> &lt;<em>script</em>&gt;alert(&quot;x&quot;)&lt;&#x2F;script&gt; &amp; water"
    )


async def test_tantivy_highlights_carry_no_markup_from_the_document(tmp_path: Path):
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    try:
        body = ('Water <script>alert("x")</script> <a href="x">link</a> ' * 12) + "water."
        doc = DocumentIn(id="x", title="<b>Water</b> & more", body=body)
        await backend.index("default", [doc], refresh=True)
        query = SearchQuery(text="water script", top_k=1, highlight=True)
        (hit,) = await backend.search("default", query)
    finally:
        await backend.close()
    assert hit.highlights
    for fragment in hit.highlights:
        bare = fragment.replace("<em>", "").replace("</em>", "")
        assert "<" not in bare, fragment
        assert ">" not in bare, fragment
        # No fragment ends inside an entity.
        assert not any(fragment.endswith(p) for p in ("&", "&l", "&lt", "&qu", "&am"))
    assert "&lt;<em>script</em>&gt;" in " ".join(hit.highlights)
    assert "&lt;b&gt;<em>Water</em>&lt;&#x2F;b&gt; &amp; more" in hit.highlights


def test_tantivy_escapes_as_lucenes_html_encoder_does():
    # Lucene's SimpleHTMLEncoder: " & < > ' / and nothing else.
    assert q.escape_html("""a"b&c<d>e'f/g ü""") == "a&quot;b&amp;c&lt;d&gt;e&#x27;f&#x2F;g ü"


def test_engine_highlights_are_html_encoded_by_the_engine():
    body = q.search_body("default", SearchQuery(text="water", highlight=True))
    assert body["highlight"]["encoder"] == "html"
    assert body["highlight"]["pre_tags"] == [q.HIGHLIGHT_PRE]


@pytest.mark.parametrize("values", [[""], ["Norvale", " "], ["en", "\t"]])
def test_an_empty_filter_value_is_rejected_with_its_index(values: list[str]):
    # Dropped, it would leave a filter that matches nothing, with no error.
    field = "language" if "en" in values else "organization"
    filters = [common_pb2.Filter(field=field, any_of=values)]
    where = field_of(lambda: common.filters_from_proto(filters, max_filters=16, max_values=256))
    assert where == f"filters[0].any_of[{len(values) - 1}]"


def test_a_document_filter_names_exact_ids_and_two_keep_what_both_name():
    def parsed(*filters: common_pb2.Filter) -> common.Filters:
        return common.filters_from_proto(list(filters), max_filters=16, max_values=256)

    one = parsed(common_pb2.Filter(field="doc_id", any_of=["10-K 2023", "a", "a"]))
    assert one.doc_ids == ("10-K 2023", "a")
    assert one.restricts
    assert not one.restricts_keywords
    both = parsed(
        common_pb2.Filter(field="doc_id", any_of=["a", "b"]),
        common_pb2.Filter(field="doc_id", any_of=["b", "c"]),
    )
    assert both.doc_ids == ("b",)
    # Nothing both name: a filter that matches nothing, not no filter at all.
    none = parsed(
        common_pb2.Filter(field="doc_id", any_of=["a"]),
        common_pb2.Filter(field="doc_id", any_of=["c"]),
    )
    assert none.doc_ids == (common.NO_MATCH,)
    assert not parsed().restricts
    bad = [common_pb2.Filter(field="doc_id", any_of=["a", " "])]
    assert field_of(lambda: common.filters_from_proto(bad, max_filters=16, max_values=256)) == (
        "filters[0].any_of[1]"
    )
    for odd in ("a ", "a\x00b", "x" * 5000):
        refused = [common_pb2.Filter(field="doc_id", any_of=["ok", odd])]
        assert field_of(
            lambda refused=refused: common.filters_from_proto(
                refused, max_filters=16, max_values=256
            )
        ) == ("filters[0].any_of[1]")
    dated = [common_pb2.Filter(field="doc_id", gte="2025-01-01")]
    assert field_of(lambda: common.filters_from_proto(dated, max_filters=16, max_values=256)) == (
        "filters[0]"
    )


def test_two_doc_id_filters_keep_the_ids_both_name_in_the_first_ones_order() -> None:
    from attest.core.common import DOC_FILTER, filters_from_proto

    first = common_pb2.Filter(field=DOC_FILTER, any_of=["c", "a", "b", "a"])
    second = common_pb2.Filter(field=DOC_FILTER, any_of=["b", "c", "z"])
    both = filters_from_proto([first, second], max_filters=8, max_values=8)
    assert list(both.doc_ids or ()) == ["c", "b"]
    alone = filters_from_proto([first], max_filters=8, max_values=8)
    assert list(alone.doc_ids or ()) == ["c", "a", "b"]
