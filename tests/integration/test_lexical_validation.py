"""Escaped highlights and out-of-range dates on every lexical backend, through gRPC."""

from __future__ import annotations

import re

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.lexical.v1 import lexical_pb2

pytestmark = pytest.mark.integration

ENTITY = re.compile(r"(?:[a-z]+|#x[0-9A-Fa-f]+|#[0-9]+);")
BODY = (
    'Marsh Alloys <script>alert("x")</script> reported its <a href="y">water</a> use & '
    "discharge. " * 8
)


async def test_highlights_are_escaped_before_marking(lexical):
    doc = common_pb2.Document(id="xss", title="<b>Marsh</b> & water", body=BODY)
    await lexical.stub.Index(lexical_pb2.IndexRequest(documents=[doc], refresh=True))
    response = await lexical.stub.Search(
        lexical_pb2.SearchRequest(query="marsh script water", top_k=1, highlight=True)
    )
    (hit,) = response.hits
    assert hit.text == BODY  # the stored text is untouched
    assert hit.highlights
    for fragment in hit.highlights:
        bare = fragment.replace("<em>", "").replace("</em>", "")
        assert "<" not in bare, fragment
        assert ">" not in bare, fragment
        # Every '&' starts a whole entity: no fragment is cut inside one.
        for piece in bare.split("&")[1:]:
            assert ENTITY.match(piece), fragment
    joined = " ".join(hit.highlights)
    assert "&lt;<em>script</em>&gt;alert(&quot;x&quot;)&lt;&#x2F;<em>script</em>&gt;" in joined
    # The same fragment from every backend.
    assert "&lt;b&gt;<em>Marsh</em>&lt;&#x2F;b&gt; &amp; <em>water</em>" in hit.highlights


@pytest.mark.parametrize("seconds", [2**62, -(2**62)])
async def test_out_of_range_publication_times_name_the_field(lexical, seconds):
    doc = common_pb2.Document(id="t", body="b", published_at=Timestamp(seconds=seconds))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await lexical.stub.Index(lexical_pb2.IndexRequest(documents=[doc]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("documents[0].published_at: ")


async def test_the_widest_date_bounds_search_and_overflowing_ones_are_refused(lexical):
    ts = Timestamp()
    ts.FromJsonString("1969-07-20T00:00:00Z")
    doc = common_pb2.Document(id="moon", body="water on the moon", published_at=ts)
    await lexical.stub.Index(lexical_pb2.IndexRequest(documents=[doc], refresh=True))
    widest = [common_pb2.Filter(field="published_at", gte="0001-01-01", lte="9999-12-31")]
    response = await lexical.stub.Search(
        lexical_pb2.SearchRequest(query="water", top_k=3, filters=widest)
    )
    assert [h.doc_id for h in response.hits] == ["moon"]
    for gte, lte, field in (
        ("0001-01-01T00:00:00+14:00", "", "filters[0].gte"),
        ("", "9999-12-31T23:59:59-14:00", "filters[0].lte"),
    ):
        filters = [common_pb2.Filter(field="published_at", gte=gte, lte=lte)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await lexical.stub.Search(
                lexical_pb2.SearchRequest(query="water", top_k=3, filters=filters)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(f"{field}: ")
