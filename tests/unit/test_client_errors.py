"""A failed call becomes the Attest error of its status code, message kept."""

from __future__ import annotations

import grpc
import pytest

from attest.client import error_from_rpc
from attest.core import errors


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
