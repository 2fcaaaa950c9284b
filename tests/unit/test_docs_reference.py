"""The generated reference (docs/hooks/reference.py) leaves nothing undocumented.

The CLI, settings and gRPC pages are generated from the code when the site is
built, so they cannot miss a command, a setting or an RPC; what they can miss
is the text. These tests fail when a settings field has no description, a
click option no help, or an RPC no comment in its .proto file, and check that
the pages hold what the code has (so a generator that silently skips
something fails too). They tolerate new pages: only the generated ones and
the README's links are checked here; mkdocs build --strict checks the rest.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ref = _load_generator()


@pytest.fixture(scope="module")
def settings_page() -> ref.Reference:  # type: ignore[name-defined]
    return ref.settings_reference()


@pytest.fixture(scope="module")
def cli_page() -> ref.Reference:  # type: ignore[name-defined]
    return ref.cli_reference()


@pytest.fixture(scope="module")
def grpc_page() -> ref.Reference:  # type: ignore[name-defined]
    return ref.grpc_reference()


def test_every_setting_has_a_description(settings_page: ref.Reference) -> None:  # type: ignore[name-defined]
    assert settings_page.undocumented == [], (
        "settings without a description (give the field Field(description=...)): "
        + ", ".join(settings_page.undocumented)
    )


def test_every_cli_option_has_help(cli_page: ref.Reference) -> None:  # type: ignore[name-defined]
    assert cli_page.undocumented == [], "commands or options without help text: " + ", ".join(
        cli_page.undocumented
    )


def test_every_rpc_has_a_comment(grpc_page: ref.Reference) -> None:  # type: ignore[name-defined]
    assert grpc_page.undocumented == [], "RPCs without a comment in their .proto: " + ", ".join(
        grpc_page.undocumented
    )


def test_settings_page_lists_every_environment_variable(
    settings_page: ref.Reference,  # type: ignore[name-defined]
) -> None:
    from attest.answer.settings import AnswerSettings
    from attest.lexical.settings import LexicalSettings

    text = settings_page.markdown
    # Service-specific fields, nested ones and an outright alias all appear by name.
    for name in (
        "ATTEST_LEXICAL_BACKEND",
        "ATTEST_LEXICAL_OPENSEARCH__HOSTS",
        "ATTEST_ANSWER_LIMITS__DOWNSTREAM__RERANK__MAX_IN_FLIGHT",
        "ATTEST_GENERATE_LLM__URL",
        "ATTEST_PIPELINE_BROKER_URL",
        "ATTEST_INGEST_KNOWLEDGE_ADDRESS",
        "ATTEST_CLIENT_TOKEN",
        "ATTEST_DATA_DIR",
    ):
        assert f"`{name}`" in text, name
    # Every top-level field of a service is on the page, under its prefix.
    for cls in (AnswerSettings, LexicalSettings):
        prefix = cls.model_config["env_prefix"]
        for field, info in cls.model_fields.items():
            env = ref._env_alias(info) or f"{prefix}{field.upper()}"
            assert f"`{env}" in text, f"{cls.__name__}.{field}"
    # A service's changed default of a shared group is said (lexical listens on 50052).
    assert "`ATTEST_LEXICAL_SERVER__PORT` = `50052`" in text
    # Secrets are never shown.
    assert "redis://localhost:6379/0" not in text


def test_settings_generator_reports_a_field_without_description() -> None:
    class Nested(BaseModel):
        documented: int = Field(default=1, description="Said.")
        silent: int = 2

    class Service(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="ATTEST_X_", env_nested_delimiter="__")
        nested: Nested = Nested()
        quiet: str = "q"

    missing: list[str] = []
    rows = {
        r.env: r
        for _, _, r in ref._walk(Service, Service.model_construct(), "ATTEST_X_", "S", missing)
        if r is not None
    }
    assert set(rows) == {"ATTEST_X_NESTED__DOCUMENTED", "ATTEST_X_NESTED__SILENT", "ATTEST_X_QUIET"}
    assert rows["ATTEST_X_NESTED__DOCUMENTED"].description == "Said."
    assert [m.rsplit(".", 2)[-2:] for m in missing] == [["Nested", "silent"], ["Service", "quiet"]]


def test_cli_page_holds_every_command_and_option(cli_page: ref.Reference) -> None:  # type: ignore[name-defined]
    from attest.cli import main

    text = cli_page.markdown

    def visit(command: click.Command, path: list[str]) -> None:
        assert f"`{' '.join(path)}`" in text
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{', '.join(param.opts + param.secondary_opts)}`" in text, path
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                visit(sub, [*path, name])

    visit(main, ["attest"])


def test_grpc_page_holds_every_rpc_and_message() -> None:
    from google.protobuf import descriptor_pool

    import attest.answer.v1.answer_pb2
    import attest.generate.v1.generate_pb2
    import attest.ingest.v1.ingest_pb2
    import attest.knowledge.v1.knowledge_pb2
    import attest.lexical.v1.lexical_pb2
    import attest.rerank.v1.rerank_pb2
    import attest.semantic.v1.semantic_pb2  # noqa: F401

    text = ref.grpc_reference().markdown
    pool = descriptor_pool.Default()
    # protos/google/ holds the HTTP annotation's definitions (googleapis' own, for
    # buf): no Attest API, so not on the page.
    protos = sorted(p for p in (ROOT / "protos").rglob("*.proto") if "google" not in p.parts)
    assert len(protos) >= 8
    for proto in protos:
        fd = pool.FindFileByName(str(proto.relative_to(ROOT / "protos")))
        for service in fd.services_by_name.values():
            assert f"### {service.name}" in text
            for method in service.methods:
                assert f"| `{method.name}` |" in text, f"{service.name}.{method.name}"
        for message in fd.message_types_by_name.values():
            assert f'id="{ref._anchor(message.full_name)}"' in text, message.full_name


def test_grpc_generator_reports_an_rpc_without_comment(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "x.proto").write_text(
        'syntax = "proto3";\npackage attest.x.v1;\n'
        "// A service.\nservice XService {\n  // Said.\n  rpc Said(M) returns (M);\n"
        "  rpc Silent(M) returns (M);\n}\n// A message.\nmessage M {}\n",
        encoding="utf-8",
    )
    original = ref.PROTOS
    ref.PROTOS = tmp_path
    try:
        page = ref.grpc_reference()
    finally:
        ref.PROTOS = original
    assert page.undocumented == ["attest.x.v1.XService.Silent"]
    assert "| `Said` |" in page.markdown
    assert "Said. |" in page.markdown


def test_http_page_without_and_with_an_openapi_document(tmp_path: Path) -> None:
    absent = ref.http_reference(tmp_path / "openapi.json")
    assert "has none yet" in absent.markdown
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "Attest", "version": "1"},
        "paths": {
            "/v1/ask": {
                "post": {
                    "summary": "Answer a question.",
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Ask"}}
                        }
                    },
                    "responses": {"200": {"description": "The answer."}},
                }
            }
        },
        "components": {
            "schemas": {
                "Ask": {
                    "type": "object",
                    "required": ["question"],
                    "properties": {"question": {"type": "string", "description": "Asked."}},
                }
            }
        },
    }
    (tmp_path / "openapi.json").write_text(json.dumps(spec), encoding="utf-8")
    page = ref.http_reference(tmp_path / "openapi.json").markdown
    assert "## `POST /v1/ask`" in page
    assert "Answer a question." in page
    assert "[Ask](#schema-ask)" in page
    assert "| `question` | `string` | True | Asked. |" in page


def test_readme_is_a_front_page_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    commands = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert commands is not None
    first_two = [line.split("#")[0].strip() for line in commands.group(1).splitlines()[:2]]
    assert first_two == ["pip install uv && uv run attest demo", "bash .ci/test.sh"]
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
