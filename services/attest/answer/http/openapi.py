"""The OpenAPI 3 document of the HTTP gateway, generated from the protos.

Paths come from the ``google.api.http`` annotations (``routes.bindings``),
schemas from the message descriptors under proto3's JSON mapping: field names
in lowerCamelCase (the snake_case names are accepted on input too), 64-bit
integers as strings, enums by name, bytes in base64, Timestamp as RFC 3339,
Duration as seconds with an ``s`` ("1.5s"). Served at ``/openapi.json``; the
copy in docs/openapi.json is checked against this output by a test.

    python -m attest.answer.http.openapi > docs/openapi.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from attest.answer.http.routes import Binding, bindings

_INT32 = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SFIXED32,
}
_UINT32 = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_FIXED64,
}
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {
        "type": "string",
        "format": "date-time",
        "description": "RFC 3339 time in UTC, e.g. 2025-03-01T12:00:00Z.",
    },
    "google.protobuf.Duration": {
        "type": "string",
        "pattern": r"^-?[0-9]+(\.[0-9]{1,9})?s$",
        "description": "Seconds with up to 9 decimals and a trailing s, e.g. 2.5s.",
    },
}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An error: the HTTP status, the gRPC status name and the message, which is "
    "the one the same call gets over gRPC.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "integer", "description": "HTTP status."},
                "status": {"type": "string", "description": "gRPC status, e.g. NOT_FOUND."},
                "message": {"type": "string", "description": "What went wrong and what to do."},
            },
            "required": ["code", "status", "message"],
        }
    },
    "required": ["error"],
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


class _Schemas:
    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def message(self, descriptor: Descriptor) -> dict[str, Any]:
        name = descriptor.full_name
        if name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[name])
        if name not in self.schemas:
            self.schemas[name] = {}  # placeholder: recursive messages refer to themselves
            properties = {field.json_name: self.field(field) for field in descriptor.fields}
            schema: dict[str, Any] = {
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
            }
            for oneof in descriptor.oneofs:
                members = [f.json_name for f in oneof.fields]
                if len(members) > 1:
                    schema.setdefault("description", "")
                    schema["description"] += f"At most one of: {', '.join(members)}. "
            if "description" in schema:
                schema["description"] = schema["description"].strip()
            self.schemas[name] = schema
        return _ref(name)

    def enum(self, descriptor: EnumDescriptor) -> dict[str, Any]:
        name = descriptor.full_name
        if name not in self.schemas:
            self.schemas[name] = {"type": "string", "enum": [v.name for v in descriptor.values]}
        return _ref(name)

    def field(self, field: FieldDescriptor) -> dict[str, Any]:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value = field.message_type.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self.scalar(value)}
        item = self.scalar(field)
        if field.is_repeated:
            return {"type": "array", "items": item}
        return item

    def scalar(self, field: FieldDescriptor) -> dict[str, Any]:
        kind = field.type
        if field.message_type is not None:
            return self.message(field.message_type)
        if field.enum_type is not None:
            return self.enum(field.enum_type)
        if kind in _INT32:
            return {
                "type": "integer",
                "format": "int32",
                "minimum": -(2**31),
                "maximum": 2**31 - 1,
            }
        if kind in _UINT32:
            return {"type": "integer", "format": "int32", "minimum": 0, "maximum": 2**32 - 1}
        if kind in _INT64:
            return {"type": "string", "format": "int64", "pattern": r"^-?[0-9]{1,19}$"}
        if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return {"type": "number"}
        if kind == FieldDescriptor.TYPE_BOOL:
            return {"type": "boolean"}
        if kind == FieldDescriptor.TYPE_BYTES:
            return {"type": "string", "format": "byte"}
        return {"type": "string"}


def _operation(binding: Binding, schemas: _Schemas) -> dict[str, Any]:
    method = binding.method
    service = method.containing_service.name
    operation: dict[str, Any] = {
        "operationId": f"{service}_{method.name}",
        "summary": f"{method.containing_service.full_name}.{method.name}",
        "tags": [service],
        "responses": {
            "default": {
                "description": "An error (the gRPC status mapped to HTTP).",
                "content": {"application/json": {"schema": _ref("Error")}},
            }
        },
    }
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1},
        }
        for name in binding.path_variables
    ]
    if binding.body == "*":
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas.message(method.input_type)}},
        }
    else:
        for field in method.input_type.fields:
            if field.name in binding.path_variables or field.type == FieldDescriptor.TYPE_MESSAGE:
                continue
            parameters.append(
                {"name": field.json_name, "in": "query", "schema": schemas.field(field)}
            )
    if parameters:
        operation["parameters"] = parameters
    output = schemas.message(method.output_type)
    if binding.streaming:
        operation["responses"]["200"] = {
            "description": f"Server-sent events, one per {method.output_type.name}: the event "
            "is named after the message's oneof case, its data is the message's JSON. An error "
            "after the first event is an `error` event with the Error JSON.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
        operation["x-event-schema"] = output
    else:
        operation["responses"]["200"] = {
            "description": method.output_type.name,
            "content": {"application/json": {"schema": output}},
        }
    return operation


def document() -> dict[str, Any]:
    """The OpenAPI document of every binding (answer and ingest)."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for binding in bindings():
        paths.setdefault(binding.path, {})[binding.verb] = _operation(binding, schemas)
    components: dict[str, Any] = {
        "schemas": {"Error": ERROR_SCHEMA, **dict(sorted(schemas.schemas.items()))},
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key or a JWT, as for gRPC's authorization metadata.",
            },
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Attest HTTP API",
            "version": "v1",
            "description": "The public RPCs of Attest over HTTP/JSON, generated from the protos' "
            "google.api.http annotations (docs/http-api.md).",
        },
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": paths,
        "components": components,
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
