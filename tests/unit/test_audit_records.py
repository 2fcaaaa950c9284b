"""What an audit record names of a request: the ids, read cheaply."""

from __future__ import annotations

import json

from attest.common.v1 import common_pb2
from attest.core.audit import AUDITED
from attest.ingest.v1 import ingest_pb2

INGEST = AUDITED["/attest.ingest.v1.IngestService/Ingest"][1]


def test_ingest_ids_from_documents_and_raw_records_small_and_large() -> None:
    large = json.dumps({"id": 'big "one"', "body": "word " * 20_000}).encode()
    request = ingest_pb2.IngestRequest(
        items=[
            ingest_pb2.IngestItem(document=common_pb2.Document(id="doc", body="b")),
            ingest_pb2.IngestItem(raw_json=b'{"_id": "beir-1", "text": "t"}'),
            ingest_pb2.IngestItem(raw_json=large),
            ingest_pb2.IngestItem(raw_json=b'{"body": "no id"'),
        ]
    )
    assert INGEST(request) == ["doc", "beir-1", 'big "one"', ""]


def test_delete_and_store_ids() -> None:
    delete = AUDITED["/attest.ingest.v1.IngestService/Delete"][1]
    assert delete(ingest_pb2.DeleteRequest(doc_ids=["a", " b"])) == ["a", " b"]
    store = AUDITED["/attest.knowledge.v1.KnowledgeService/Store"][1]
    from attest.knowledge.v1 import knowledge_pb2

    assert store(knowledge_pb2.StoreRequest(source_doc_id="d")) == ["d"]
