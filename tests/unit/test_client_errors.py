"""A failed call becomes the Attest error of its status code, message kept."""

from __future__ import annotations

import grpc
import pytest

from attest.client import error_from_rpc
from attest.core import errors
from attest.core.common import DOC_FILTER


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
        (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.UNKNOWN, errors.Internal),
    ],
)
def test_status_codes_map_to_typed_errors(code: grpc.StatusCode, kind: type) -> None:
    err = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="why")
    got = error_from_rpc(err)
    assert type(got) is kind
    assert "why" in str(got)
    assert got.code == kind.code


def test_asking_of_named_documents_filters_every_retriever_by_doc_id():
    from attest.client import options

    asked = options(documents=["ACME_2019_10K", "GLOBEX_2019_10K"])
    (only,) = asked.retrieval.filters
    assert (only.field, list(only.any_of)) == (DOC_FILTER, ["ACME_2019_10K", "GLOBEX_2019_10K"])
    assert not options().retrieval.filters


def test_attest_ask_refuses_an_empty_document_id_before_calling_anyone():
    from click.testing import CliRunner

    from attest.answer.commands import ask

    result = CliRunner().invoke(ask, ["What?", "--document", " ", "--address", "127.0.0.1:9"])
    assert result.exit_code == 2
    assert "a document id must not be empty" in result.output


def test_one_document_id_given_as_a_string_is_that_document_not_its_characters():
    from attest.client import options

    (only,) = options(documents="ACME_2019_10K").retrieval.filters
    assert (only.field, list(only.any_of)) == (DOC_FILTER, ["ACME_2019_10K"])
