"""The HTTP bindings of the public RPCs, read from the protos' ``google.api.http``
annotations: nothing here names a path, the descriptors do.

A binding is a verb and a path template (``/v1/ingest/jobs/{job_id}``) and
where the request comes from: the JSON body (``body: "*"``) or the path
variables and the query string (no body).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from google.api import annotations_pb2
from google.protobuf.descriptor import FileDescriptor, MethodDescriptor

from attest.answer.v1 import answer_pb2
from attest.ingest.v1 import ingest_pb2

#: The public services the gateway can expose, in the order of the OpenAPI document.
PUBLIC_FILES: tuple[FileDescriptor, ...] = (answer_pb2.DESCRIPTOR, ingest_pb2.DESCRIPTOR)

_VERBS = ("get", "put", "post", "delete", "patch")
_VARIABLE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class Binding:
    """One RPC reachable over HTTP."""

    method: MethodDescriptor
    verb: str
    path: str
    #: "*" when the JSON body is the whole request; "" when it has no body.
    body: str

    @property
    def service(self) -> str:
        return self.method.containing_service.full_name

    @property
    def full_method(self) -> str:
        """The gRPC method path, e.g. ``/attest.answer.v1.AnswerService/Ask``."""
        return f"/{self.service}/{self.method.name}"

    @property
    def streaming(self) -> bool:
        return bool(self.method.server_streaming)

    @property
    def path_variables(self) -> list[str]:
        return _VARIABLE.findall(self.path)


def bindings(files: Iterable[FileDescriptor] = PUBLIC_FILES) -> list[Binding]:
    """Every annotated unary or server-streaming method of ``files``' services."""
    found: list[Binding] = []
    for file in files:
        for service in file.services_by_name.values():
            for method in service.methods:
                options = method.GetOptions()
                if not options.HasExtension(annotations_pb2.http):
                    continue
                if method.client_streaming:
                    raise ValueError(f"{method.full_name}: client streams have no HTTP binding")
                rule = options.Extensions[annotations_pb2.http]
                verb = rule.WhichOneof("pattern")
                if verb not in _VERBS:
                    raise ValueError(f"{method.full_name}: unsupported HTTP pattern {verb!r}")
                if rule.body not in ("", "*"):
                    raise ValueError(f"{method.full_name}: body must be '*' or empty")
                path = getattr(rule, verb)
                binding = Binding(method=method, verb=verb, path=path, body=rule.body)
                fields = method.input_type.fields_by_name
                for variable in binding.path_variables:
                    if variable not in fields:
                        raise ValueError(f"{method.full_name}: no field {variable!r} for {path}")
                found.append(binding)
    return found
