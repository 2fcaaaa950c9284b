"""Reference pages generated from the code when the site is built.

An MkDocs hook (``hooks:`` in mkdocs.yml): ``on_files`` adds four pages that
exist only in the built site, so there is nothing to keep in sync by hand:

- ``reference/cli.md``      every command and option of the ``attest`` click group
- ``reference/settings.md`` every field of the services' pydantic settings, with its
                            environment variable, type and default
- ``reference/grpc.md``     every service, RPC, message, field and enum of protos/,
                            with the comments written in the .proto files
- ``reference/http.md``     docs/openapi.json rendered, where that file exists

Each generator also returns what it found undocumented (a setting without a
description, an option without help, an RPC without a comment);
tests/unit/test_docs_reference.py fails on any of them.
"""

from __future__ import annotations

import importlib
import inspect
import json
import tempfile
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
# Plots the benchmarks write; served under results/plots/ without a copy in docs/.
PLOTS = ROOT / "loadtest" / "reports"
OPENAPI = ROOT / "docs" / "openapi.json"

# Every settings class a process reads from the environment: (module, class).
# A new top-level settings class belongs here (the coverage test walks these).
SETTINGS_CLASSES: tuple[tuple[str, str], ...] = (
    ("attest.answer.settings", "AnswerSettings"),
    ("attest.ingest.settings", "IngestSettings"),
    ("attest.ingest.knowledge", "KnowledgeFactsSettings"),
    ("attest.lexical.settings", "LexicalSettings"),
    ("attest.semantic.settings", "SemanticSettings"),
    ("attest.rerank.settings", "RerankSettings"),
    ("attest.generate.settings", "GenerateSettings"),
    ("attest.knowledge.settings", "KnowledgeSettings"),
    ("attest.pipeline.settings", "PipelineSettings"),
    ("attest.core.settings", "ClientSecurity"),
)

# Nested models that several services share: documented once, in a section of
# their own; each service lists only the defaults it changes.
SHARED_MODELS = ("ServerSettings", "LoggingSettings", "ClientSettings", "RequestLimits")


@dataclass
class Reference:
    """One generated page and what its generator found undocumented."""

    path: str
    markdown: str
    undocumented: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- settings


@dataclass
class SettingRow:
    env: str
    type: str
    default: str
    description: str


def _type_name(annotation: Any) -> str:
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _model_in(annotation: Any) -> type | None:
    """The pydantic model an annotation holds (``Model`` or ``Model | None``)."""
    from pydantic import BaseModel

    candidates = typing.get_args(annotation) or (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default_text(value: Any) -> str:
    from pydantic import SecretStr

    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, (list, dict, bool, int, float, str)) or value is None:
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"`{text}`".replace("|", "\\|")


def _env_alias(info: Any) -> str | None:
    """An environment name given outright (``AliasChoices("ATTEST_DATA_DIR", ...)``)."""
    alias = info.validation_alias
    choices = getattr(alias, "choices", None)
    for choice in choices or ([alias] if isinstance(alias, str) else []):
        if isinstance(choice, str) and choice.isupper():
            return choice
    return None


def _doc(model: type) -> str:
    return " ".join((model.__doc__ or "").split())


def _walk(
    model: type, instance: Any, prefix: str, owner: str, undocumented: list[str]
) -> Iterator[tuple[str, Any, SettingRow | None]]:
    """Yields (dotted name, nested model or None, leaf row) for every field."""
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        value = getattr(instance, name)
        env = prefix + (info.alias or name).upper()
        nested = _model_in(info.annotation)
        if nested is not None and value is not None:
            yield name, nested, None
            for sub, sub_model, row in _walk(nested, value, env + "__", owner, undocumented):
                yield f"{name}.{sub}", sub_model, row
            continue
        description = " ".join((info.description or "").split())
        if not description:
            undocumented.append(f"{_defined_in(model, name)}.{name}")
        yield (
            name,
            None,
            SettingRow(
                env=_env_alias(info) or env,
                type=_type_name(info.annotation),
                default=_default_text(value),
                description=description,
            ),
        )


def _defined_in(model: type, name: str) -> str:
    """The class that declares a field (inherited fields are reported once, where written)."""
    for klass in model.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            return f"{klass.__module__}.{klass.__name__}"
    return f"{model.__module__}.{model.__name__}"


def _table(rows: list[SettingRow]) -> list[str]:
    lines = ["| variable | type | default | description |", "|---|---|---|---|"]
    for row in rows:
        description = row.description.replace("|", "\\|") or "*undocumented*"
        lines.append(f"| `{row.env}` | {row.type} | {row.default} | {description} |")
    return lines


def settings_reference() -> Reference:
    undocumented: list[str] = []
    shared: dict[str, type] = {}
    out = [
        "# Settings",
        "",
        "Generated from the services' settings classes when this site is built. Every",
        "setting is an environment variable: the service's prefix, then the field's",
        "path joined with `__` (`ATTEST_LEXICAL_SERVER__PORT=50052`). A nested group",
        "may also be given whole as JSON (`ATTEST_LEXICAL_OPENSEARCH__HOSTS='[\"https://search:9200\"]'`).",
        "A value that does not validate, and an unknown key inside a nested JSON value,",
        "stop the process at start-up; a misspelt variable *name* is not seen at all,",
        "which is why the chart and compose files are checked against these names",
        "(`tests/deploy/test_env_names.py`). Secret values never appear in logs.",
        "",
        "Groups that every service has (server, logging, client calls, request limits)",
        "are described once at the end; each service lists the defaults it changes.",
        "",
    ]
    for module_name, class_name in SETTINGS_CLASSES:
        cls = getattr(importlib.import_module(module_name), class_name)
        instance = cls.model_construct()
        # Defaults as the class declares them, never the environment of the build.
        instance = cls.model_construct(
            **{n: i.get_default(call_default_factory=True) for n, i in cls.model_fields.items()}
        )
        prefix = cls.model_config.get("env_prefix", "")
        out += [f"## {prefix}* ({class_name})", ""]
        if _doc(cls):
            out += [_doc(cls), ""]
        out.append(f"Defined in `{module_name}`.")
        out.append("")
        rows: list[SettingRow] = []
        notes: list[str] = []
        skip: set[str] = set()
        for name, nested, row in _walk(cls, instance, prefix, class_name, undocumented):
            if any(name.startswith(s + ".") for s in skip):
                continue
            if nested is not None:
                base = next((m for m in nested.__mro__ if m.__name__ in SHARED_MODELS), None)
                if base is not None and "." not in name:
                    skip.add(name)
                    shared[base.__name__] = base
                    changed = _changed_defaults(
                        base, nested, getattr(instance, name), f"{prefix}{name.upper()}__"
                    )
                    env = prefix + name.upper() + "__*"
                    text = f"`{env}`: see [{base.__name__}](#{base.__name__.lower()})"
                    if changed:
                        text += "; here " + ", ".join(changed)
                    notes.append(text)
                continue
            if row is not None:
                rows.append(row)
        out += _table(rows)
        out.append("")
        for note in notes:
            out.append(f"- {note}")
        out.append("")
    for name in SHARED_MODELS:
        model = shared.get(name)
        if model is None:
            continue
        out += [f"## {name}", ""]
        if _doc(model):
            out += [_doc(model), ""]
        out.append("Variable names below follow the service's prefix and the group's name,")
        out.append("shown here as `<PREFIX>`, e.g. `ATTEST_ANSWER_SERVER__`.")
        out.append("")
        rows = [
            r for _, _, r in _walk(model, model(), "<PREFIX>", name, undocumented) if r is not None
        ]
        out += _table(rows)
        out.append("")
    return Reference("reference/settings.md", "\n".join(out), sorted(set(undocumented)))


def _changed_defaults(base: type, actual: type, value: Any, prefix: str) -> list[str]:
    """Leaves whose default in this service differs from the shared model's."""
    changed: list[str] = []
    plain = {n: r for n, _, r in _walk(base, base(), "", "", []) if r is not None}
    for name, _, row in _walk(actual, value, prefix, "", []):
        if row is None:
            continue
        if name not in plain:
            changed.append(f"`{row.env}` {row.default} ({row.description or 'undocumented'})")
        elif plain[name].default != row.default:
            changed.append(f"`{row.env}` = {row.default}")
    return changed


# --------------------------------------------------------------------------- CLI


def cli_reference() -> Reference:
    import click

    from attest.cli import main

    undocumented: list[str] = []
    out = [
        "# Command line",
        "",
        "Generated from the `attest` click group when this site is built; the same",
        "text as `attest COMMAND --help`.",
        "",
    ]

    def visit(command: click.Command, path: list[str]) -> None:
        nonlocal out
        name = " ".join(path)
        out.append(f"{'#' * min(len(path) + 1, 4)} `{name}`")
        out.append("")
        help_text = inspect.cleandoc(command.help or "")
        if not help_text:
            undocumented.append(f"{name} (command)")
        # click's \b marks a paragraph to keep as written.
        help_text = help_text.replace("\b\n", "").replace("\b", "")
        out.append(help_text)
        out.append("")
        ctx = click.Context(command, info_name=name)
        usage = " ".join(command.collect_usage_pieces(ctx))
        out += ["```", f"{name} {usage}".rstrip(), "```", ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            out += ["| option | help | default |", "|---|---|---|"]
            for param in params:
                if isinstance(param, click.Argument):
                    label = param.human_readable_name
                    text = getattr(param, "help", None) or "(argument)"
                else:
                    label = ", ".join(param.opts + param.secondary_opts)
                    text = getattr(param, "help", None) or ""
                    if not text.strip():
                        undocumented.append(f"{name} {label}")
                    if isinstance(param.type, click.Choice):
                        text += " One of: " + ", ".join(str(c) for c in param.type.choices) + "."
                default = param.default
                unset = default is None or callable(default) or default == ()
                # click 8.3 marks "no default" with a sentinel object.
                unset = unset or type(default).__name__ == "Sentinel"
                shown = "" if unset else f"`{default}`"
                if isinstance(param, click.Option) and param.is_flag and default is False:
                    shown = ""
                cell = " ".join(text.split()).replace("|", "\\|")
                out.append(f"| `{label}` | {cell} | {shown} |")
            out.append("")
        if isinstance(command, click.Group):
            for sub_name in sorted(command.commands):
                visit(command.commands[sub_name], [*path, sub_name])

    visit(main, ["attest"])
    return Reference("reference/cli.md", "\n".join(out), undocumented)


# --------------------------------------------------------------------------- gRPC

# FileDescriptorProto / DescriptorProto field numbers, for source-info paths.
_MESSAGE, _ENUM, _SERVICE = 4, 5, 6
_FIELD, _NESTED, _NESTED_ENUM = 2, 3, 4
_METHOD, _VALUE = 2, 2


def _descriptor_set() -> Any:
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(
            [
                "protoc",
                f"-I{PROTOS}",
                f"-I{include}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                *files,
            ]
        )
        if code != 0:
            raise RuntimeError(f"protoc could not read protos/ (exit {code})")
        result = descriptor_pb2.FileDescriptorSet()
        result.ParseFromString(out.read_bytes())
    return result


def _comment(comments: dict[tuple[int, ...], str], path: tuple[int, ...]) -> str:
    return " ".join(comments.get(path, "").split())


def _anchor(full_name: str) -> str:
    return full_name.replace(".", "").lower()


def grpc_reference() -> Reference:
    undocumented: list[str] = []
    out = [
        "# gRPC API",
        "",
        "Generated from the `.proto` files under `protos/` when this site is built,",
        "with the comments written there. Each service is the package",
        "`attest.<service>.v1`; every request carries no tenant (it comes from the",
        "caller's credential, see [Authentication and tenants](../how-to/auth.md)).",
        "",
    ]
    files = [f for f in _descriptor_set().file if f.package.startswith("attest.")]
    _MAPS.clear()
    for proto in files:
        _collect_maps(f".{proto.package}", proto.message_type)
    for proto in sorted(files, key=lambda f: (f.package != "attest.common.v1", f.name)):
        comments = {
            tuple(loc.path): loc.leading_comments
            for loc in proto.source_code_info.location
            if loc.leading_comments
        }
        out += [f"## {proto.package}", "", f"`protos/{proto.name}`", ""]
        for s_index, service in enumerate(proto.service):
            full = f"{proto.package}.{service.name}"
            out += [f"### {service.name}", "", _comment(comments, (_SERVICE, s_index)), ""]
            out += ["| RPC | request | response | what it does |", "|---|---|---|---|"]
            for m_index, method in enumerate(service.method):
                text = _comment(comments, (_SERVICE, s_index, _METHOD, m_index))
                if not text:
                    undocumented.append(f"{full}.{method.name}")
                request = _type_link(method.input_type, method.client_streaming)
                response = _type_link(method.output_type, method.server_streaming)
                out.append(f"| `{method.name}` | {request} | {response} | {text} |")
            out.append("")
        for m_index, message in enumerate(proto.message_type):
            _message(out, comments, proto.package, message, (_MESSAGE, m_index))
        for e_index, enum in enumerate(proto.enum_type):
            _enum(out, comments, proto.package, enum, (_ENUM, e_index))
    return Reference("reference/grpc.md", "\n".join(out), undocumented)


# Map fields are repeated entries of a generated message: shown as map<key, value>.
_MAPS: dict[str, str] = {}


def _collect_maps(scope: str, messages: Any) -> None:
    for message in messages:
        full = f"{scope}.{message.name}"
        if message.options.map_entry:
            key, value = message.field
            _MAPS[full] = f"map<{_field_type(key)}, {_field_type(value)}>"
        _collect_maps(full, message.nested_type)


def _field_type(item: Any) -> str:
    if item.type_name in _MAPS:
        return _MAPS[item.type_name]
    if item.type_name:
        return _type_link(item.type_name)
    return f"`{_SCALARS.get(item.type, str(item.type))}`"


def _type_link(type_name: str, stream: bool = False) -> str:
    name = type_name.lstrip(".")
    if name.startswith("attest."):
        text = f"[`{name.rsplit('.', 1)[-1]}`](#{_anchor(name)})"
    else:
        text = f"`{name}`"
    return f"stream {text}" if stream else text


_SCALARS = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64",
    7: "fixed32", 8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32",
    16: "sfixed64", 17: "sint32", 18: "sint64",
}  # fmt: skip


def _message(
    out: list[str], comments: dict[tuple[int, ...], str], scope: str, message: Any,
    path: tuple[int, ...],
) -> None:  # fmt: skip
    full = f"{scope}.{message.name}"
    if message.options.map_entry:
        return
    out += [
        f'<h4 id="{_anchor(full)}"><code>{full.removeprefix(scope.split(".v1")[0] + ".")}'
        "</code> (message)</h4>",
        "",
        _comment(comments, path),
        "",
    ]
    if message.field:
        out += ["| field | type | description |", "|---|---|---|"]
        for f_index, item in enumerate(message.field):
            kind = _field_type(item)
            if item.label == 3 and item.type_name not in _MAPS:
                kind = "repeated " + kind
            text = _comment(comments, (*path, _FIELD, f_index)).replace("|", "\\|")
            out.append(f"| `{item.name}` | {kind} | {text} |")
        out.append("")
    for n_index, nested in enumerate(message.nested_type):
        _message(out, comments, full, nested, (*path, _NESTED, n_index))
    for e_index, enum in enumerate(message.enum_type):
        _enum(out, comments, full, enum, (*path, _NESTED_ENUM, e_index))


def _enum(
    out: list[str], comments: dict[tuple[int, ...], str], scope: str, enum: Any,
    path: tuple[int, ...],
) -> None:  # fmt: skip
    full = f"{scope}.{enum.name}"
    out += [
        f'<h4 id="{_anchor(full)}"><code>{full.removeprefix(scope.split(".v1")[0] + ".")}'
        "</code> (enum)</h4>",
        "",
        _comment(comments, path),
        "",
        "| value | number | meaning |",
        "|---|---|---|",
    ]
    for v_index, value in enumerate(enum.value):
        text = _comment(comments, (*path, _VALUE, v_index)).replace("|", "\\|")
        out.append(f"| `{value.name}` | {value.number} | {text} |")
    out.append("")


# --------------------------------------------------------------------------- HTTP


def http_reference(openapi: Path = OPENAPI) -> Reference:
    out = ["# HTTP API", ""]
    if not openapi.is_file():
        out += [
            "The answer service's HTTP/JSON surface is described by an OpenAPI document,",
            "`docs/openapi.json`, rendered here when the site is built. This checkout",
            "has none yet, so there is nothing to list; the gRPC contract it mirrors is",
            "in the [gRPC API](grpc.md).",
            "",
        ]
        return Reference("reference/http.md", "\n".join(out))
    spec = json.loads(openapi.read_text(encoding="utf-8"))
    info = spec.get("info", {})
    out += [
        f"Generated from `docs/openapi.json` ({info.get('title', 'OpenAPI')} "
        f"{info.get('version', '')}, OpenAPI {spec.get('openapi', '?')}) when this site is built.",
        "",
    ]
    if info.get("description"):
        out += [info["description"], ""]
    for route, operations in sorted(spec.get("paths", {}).items()):
        for method, op in operations.items():
            if method.startswith("x-") or not isinstance(op, dict) or method == "parameters":
                continue
            out += [f"## `{method.upper()} {route}`", ""]
            if op.get("summary"):
                out += [op["summary"], ""]
            if op.get("description"):
                out += [op["description"], ""]
            params = [*operations.get("parameters", []), *op.get("parameters", [])]
            if params:
                out += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for p in params:
                    p = _resolve(spec, p)
                    text = " ".join(str(p.get("description", "")).split()).replace("|", "\\|")
                    out.append(
                        f"| `{p.get('name')}` | {p.get('in')} | {p.get('required', False)} "
                        f"| {text} |"
                    )
                out.append("")
            body = op.get("requestBody")
            if body:
                out += ["Request body:", "", *_content(spec, _resolve(spec, body)), ""]
            for code, response in sorted(op.get("responses", {}).items()):
                response = _resolve(spec, response)
                out.append(f"- **{code}**: {' '.join(response.get('description', '').split())}")
                out += [f"    {line}" for line in _content(spec, response)]
            out.append("")
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        out += ["## Schemas", ""]
        for name, schema in sorted(schemas.items()):
            out += [f"### {name} {{ #{_schema_anchor(name)} }}", ""]
            if schema.get("description"):
                out += [" ".join(schema["description"].split()), ""]
            props = schema.get("properties", {})
            if props:
                required = set(schema.get("required", []))
                out += ["| property | type | required | description |", "|---|---|---|---|"]
                for prop, body in props.items():
                    text = " ".join(str(body.get("description", "")).split()).replace("|", "\\|")
                    out.append(f"| `{prop}` | {_schema_type(body)} | {prop in required} | {text} |")
                out.append("")
    return Reference("reference/http.md", "\n".join(out))


def _schema_anchor(name: str) -> str:
    """A schema's anchor: its full name in lower case, dots as dashes."""
    return "schema-" + name.lower().replace(".", "-")


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return node
    target: Any = spec
    for part in ref[2:].split("/"):
        target = target.get(part, {})
    return target if isinstance(target, dict) else {}


def _schema_type(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return f"[{name.rsplit('.', 1)[-1]}](#{_schema_anchor(name)})"
    if schema.get("type") == "array":
        return "array of " + _schema_type(schema.get("items", {}))
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " or ".join(_schema_type(s) for s in schema[key])
    return f"`{schema.get('type', 'object')}`"


def _content(spec: dict[str, Any], node: dict[str, Any]) -> list[str]:
    lines = []
    for media, body in node.get("content", {}).items():
        lines.append(f"`{media}`: {_schema_type(body.get('schema', {}))}")
    return lines


# --------------------------------------------------------------------------- MkDocs


def references() -> list[Reference]:
    return [cli_reference(), settings_reference(), grpc_reference(), http_reference()]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for ref in references():
        files.append(File.generated(config, ref.path, content=ref.markdown + "\n"))
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"results/plots/{plot.name}", abs_src_path=str(plot)))
    return files
