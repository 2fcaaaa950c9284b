"""The ESG knowledge graph: the shipped file, the loader's validation, traversal and `kg stats`."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from attest.knowledge.commands import format_stats, kg
from attest.knowledge.graph import (
    ALLOWED_RELATIONS,
    GRI_NONE,
    GraphError,
    KnowledgeGraph,
    Level,
    load_graph,
)

# Every GRI topic standard (GRI 201-207, 301-308, 401-419) and the pillar it
# belongs under: the economic series sits under Governance.
GRI_TOPICS = {
    **{n: "governance" for n in range(201, 208)},
    **{n: "environment" for n in range(301, 309)},
    **{n: "social" for n in range(401, 420)},
}
# The public data folder lies beside the repository (../shared), in CI too.
SHARED = Path(os.environ.get("ATTEST_SHARED_DIR", Path(__file__).resolve().parents[3] / "shared"))
GRI_TOPICS_JSON = SHARED / "data/esg/gri/gri_topics.json"


@pytest.fixture(scope="module")
def graph() -> KnowledgeGraph:
    return load_graph()


# ----------------------------------------------------------- shipped graph


def test_shipped_graph_validates_with_version_and_rso_credit(graph: KnowledgeGraph) -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", graph.version)
    assert graph.root_id == "sustainability"
    credits = " ".join(" ".join(c.values()) for c in graph.credits)
    assert "RSO" in credits
    assert "CC BY 4.0" in credits


def test_stats_counts(graph: KnowledgeGraph) -> None:
    stats = graph.stats()
    levels, relations = stats["levels"], stats["relations"]
    assert list(levels) == ["root", "pillar", "basic", "intermediate", "lower"]
    assert list(relations) == ["contains", "process", "measured_as", "type", "source"]
    assert levels["root"] == 1
    assert levels["pillar"] == 3
    assert levels["basic"] == 42  # 34 GRI topic standards + 8 GRI_none topics
    assert levels["intermediate"] + levels["lower"] >= 120
    assert sum(levels.values()) == len(graph.entities)
    assert sum(relations.values()) == len(graph.edges)
    # root -> 3 pillars and pillar -> 42 basic entities are all `contains`, and
    # a DAG has at least one edge per non-root node.
    assert relations["contains"] >= 3 + 42
    assert len(graph.edges) >= len(graph.entities) - 1
    assert all(n > 0 for n in relations.values())


def test_pillars_hang_from_the_root(graph: KnowledgeGraph) -> None:
    assert graph.children("sustainability") == ["environment", "social", "governance"]
    for pillar in ("environment", "social", "governance"):
        assert graph.entity(pillar).level is Level.PILLAR
        assert graph.parents(pillar) == ["sustainability"]


def test_every_gri_topic_is_a_basic_entity_under_its_pillar(graph: KnowledgeGraph) -> None:
    for number, pillar in GRI_TOPICS.items():
        entity = graph.gri_topic(number)
        assert entity is not None, number
        assert entity.id == f"gri-{number}"
        assert entity.gri_id == f"GRI {number}"
        assert entity.level is Level.BASIC
        assert graph.parents(entity.id) == [pillar]
    gri = [e for e in graph.at_level(Level.BASIC) if e.gri_id != GRI_NONE]
    assert len(gri) == len(GRI_TOPICS) == 34


def test_gri_numbers_and_names_match_the_gri_topic_list(graph: KnowledgeGraph) -> None:
    standards = json.loads(GRI_TOPICS_JSON.read_text())["standards"]
    assert {s["number"] for s in standards} == set(GRI_TOPICS)
    pillars = {"Economic": "governance", "Environmental": "environment", "Social": "social"}
    for standard in standards:
        entity = graph.gri_topic(standard["number"])
        assert entity is not None
        assert entity.name.casefold() == standard["title"].casefold()
        assert graph.parents(entity.id) == [pillars[standard["pillar"]]]


def test_basic_entities_without_a_gri_number(graph: KnowledgeGraph) -> None:
    none = {e.id for e in graph.at_level(Level.BASIC) if e.gri_id == GRI_NONE}
    assert len(none) >= 6
    assert {"climate-change", "sustainable-agriculture", "executive-compensation"} <= none
    assert graph.parents("climate-change") == ["environment"]
    assert graph.parents("executive-compensation") == ["governance"]


def test_only_basic_entities_carry_a_gri_id(graph: KnowledgeGraph) -> None:
    for entity in graph.entities.values():
        assert (entity.gri_id is not None) == (entity.level is Level.BASIC), entity.id


def test_every_edge_uses_a_relation_allowed_for_its_levels(graph: KnowledgeGraph) -> None:
    for edge in graph.edges:
        pair = (graph.entity(edge.parent).level, graph.entity(edge.child).level)
        assert edge.relation in ALLOWED_RELATIONS[pair], edge


def test_every_entity_is_documented(graph: KnowledgeGraph) -> None:
    for entity in graph.entities.values():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", entity.id)
        assert entity.name
        sentences = re.findall(r"[.!?](?:\s|$)", entity.definition)
        assert 1 <= len(sentences) <= 2, entity.id
        if entity.level is not Level.ROOT:
            assert entity.aliases, entity.id


def test_carbon_dioxide_emission_paths_reach_the_root_through_emissions(
    graph: KnowledgeGraph,
) -> None:
    paths = graph.paths_to_root("carbon-dioxide-emission")
    assert [
        "carbon-dioxide-emission",
        "greenhouse-gas-emission",
        "gri-305",
        "environment",
        "sustainability",
    ] in paths
    # Greenhouse gas emission is also a measure of climate change (a DAG).
    assert [
        "carbon-dioxide-emission",
        "greenhouse-gas-emission",
        "climate-change",
        "environment",
        "sustainability",
    ] in paths
    assert len(paths) == 2
    assert graph.entity("gri-305").gri_id == "GRI 305"
    ghg_edges = graph.parent_edges("greenhouse-gas-emission")
    assert {(e.parent, e.relation) for e in ghg_edges} == {
        ("gri-305", "measured_as"),
        ("climate-change", "measured_as"),
    }
    assert graph.parent_edges("carbon-dioxide-emission")[0].relation == "type"


def test_ancestors_are_every_node_on_every_path_ordered_upwards(graph: KnowledgeGraph) -> None:
    ancestors = graph.ancestors("carbon-dioxide-emission")
    assert ancestors == [
        "carbon-dioxide-emission",
        "greenhouse-gas-emission",
        "gri-305",
        "climate-change",
        "environment",
        "sustainability",
    ]
    assert graph.ancestors("sustainability") == ["sustainability"]
    for entity_id in graph.entities:
        on_paths = {n for path in graph.paths_to_root(entity_id) for n in path}
        assert set(graph.ancestors(entity_id)) == on_paths
        assert all(path[-1] == "sustainability" for path in graph.paths_to_root(entity_id))


def test_scopes_and_gases_under_greenhouse_gas_emission(graph: KnowledgeGraph) -> None:
    children = {e.child: e.relation for e in graph.child_edges("greenhouse-gas-emission")}
    assert children["carbon-dioxide-emission"] == "type"
    assert children["methane-emission"] == "type"
    for scope in ("scope-1-emissions", "scope-2-emissions", "scope-3-emissions"):
        assert children[scope] == "source"


def test_attributes_and_exact_lookup(graph: KnowledgeGraph) -> None:
    attributes = graph.attributes("carbon-dioxide-emission")
    assert attributes[0] == "Carbon dioxide emission"
    assert {"CO2 emissions", "carbon emissions"} <= set(attributes)
    with_definition = graph.attributes("carbon-dioxide-emission", with_definition=True)
    assert with_definition[:-1] == attributes
    assert with_definition[-1] == graph.entity("carbon-dioxide-emission").definition
    assert graph.lookup("  co2   EMISSIONS ") == ["carbon-dioxide-emission"]
    assert graph.lookup("child labour") == ["gri-408"]
    assert graph.lookup("no such thing") == []


def test_unknown_entity_raises_key_error_naming_it(graph: KnowledgeGraph) -> None:
    with pytest.raises(KeyError, match="nope"):
        graph.parents("nope")
    with pytest.raises(KeyError, match="nope"):
        graph.paths_to_root("nope")
    assert "nope" not in graph
    assert "gri-303" in graph


# ------------------------------------------------------------ validation

BASE: dict[str, Any] = {
    "version": "0.0.1",
    "entities": [
        {"id": "root", "level": "root", "name": "Root", "definition": "The root."},
        {
            "id": "env",
            "level": "pillar",
            "name": "Env",
            "definition": "A pillar.",
            "parents": {"root": "contains"},
        },
        {
            "id": "gri-305",
            "level": "basic",
            "gri": "305",
            "name": "Emissions",
            "definition": "A topic.",
            "parents": {"env": "contains"},
        },
        {
            "id": "ghg",
            "level": "intermediate",
            "name": "GHG",
            "aliases": ["greenhouse gases"],
            "definition": "An indicator.",
            "parents": {"gri-305": "measured_as"},
        },
        {
            "id": "co2",
            "level": "lower",
            "name": "CO2",
            "definition": "A gas.",
            "parents": {"ghg": "type"},
        },
    ],
}


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "graph.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _entity(data: dict[str, Any], entity_id: str) -> dict[str, Any]:
    return next(e for e in data["entities"] if e["id"] == entity_id)


def _invalid(tmp_path: Path, data: dict[str, Any]) -> GraphError:
    with pytest.raises(GraphError) as info:
        load_graph(_write(tmp_path, data))
    return info.value


def test_small_graph_loads(tmp_path: Path) -> None:
    graph = load_graph(_write(tmp_path, BASE))
    assert graph.version == "0.0.1"
    assert graph.paths_to_root("co2") == [["co2", "ghg", "gri-305", "env", "root"]]
    assert graph.stats()["levels"] == {
        "root": 1,
        "pillar": 1,
        "basic": 1,
        "intermediate": 1,
        "lower": 1,
    }
    assert graph.stats()["relations"]["contains"] == 2


def test_graph_error_is_a_value_error() -> None:
    assert issubclass(GraphError, ValueError)


def test_unknown_level(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "ghg")["level"] = "middle"
    err = _invalid(tmp_path, data)
    assert err.entity_id == "ghg"
    assert "'ghg'" in str(err)
    assert "unknown level 'middle'" in str(err)


def test_duplicate_id(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["entities"].append(copy.deepcopy(_entity(data, "co2")))
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "'co2': duplicate id" in str(err)


def test_dangling_relation(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {"ghg": "type", "methane": "type"}
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "dangling relation 'type' from unknown parent 'methane'" in str(err)


def test_relation_not_allowed_for_the_level_pair(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {"ghg": "contains"}
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "relation 'contains' from 'ghg' is not allowed from intermediate to lower" in str(err)
    assert "measured_as, source, type" in str(err)


def test_skipping_a_level_is_not_allowed(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {"gri-305": "measured_as"}
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "from basic to lower" in str(err)


def test_unknown_relation_name(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {"ghg": "kind_of"}
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "unknown relation 'kind_of'" in str(err)


def test_node_that_does_not_reach_the_root(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    del _entity(data, "ghg")["parents"]
    err = _invalid(tmp_path, data)
    # The parentless entity is named, not its child that hangs from it.
    assert err.entity_id == "ghg"
    assert "'ghg': does not reach the root 'root' (it has no parents)" in str(err)


def test_second_root(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["entities"].append({"id": "root-2", "level": "root", "name": "R2", "definition": "x."})
    err = _invalid(tmp_path, data)
    assert err.entity_id == "root-2"
    assert "second root" in str(err)


def test_cycle(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "ghg")["parents"] = {"gri-305": "measured_as", "co2": "type"}
    err = _invalid(tmp_path, data)
    assert err.entity_id in {"ghg", "co2"}
    assert "cycle" in str(err)
    assert re.search(r"(ghg -> co2 -> ghg|co2 -> ghg -> co2)", str(err))


def test_self_loop(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {"ghg": "type", "co2": "type"}
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "cycle: co2 -> co2" in str(err)


@pytest.mark.parametrize("field", ["name", "definition"])
def test_missing_name_or_definition(tmp_path: Path, field: str) -> None:
    data = copy.deepcopy(BASE)
    del _entity(data, "ghg")[field]
    err = _invalid(tmp_path, data)
    assert err.entity_id == "ghg"
    assert f"'ghg': missing {field}" in str(err)


def test_blank_definition_counts_as_missing(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["definition"] = "   "
    err = _invalid(tmp_path, data)
    assert "'co2': missing definition" in str(err)


def test_gri_missing_on_a_gri_topic(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    del _entity(data, "gri-305")["gri"]
    err = _invalid(tmp_path, data)
    assert err.entity_id == "gri-305"
    assert "'gri-305': basic entity has no gri" in str(err)


def test_gri_that_contradicts_the_id(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "gri-305")["gri"] = "304"
    err = _invalid(tmp_path, data)
    assert err.entity_id == "gri-305"
    assert "id names GRI 305" in str(err)


def test_gri_on_a_non_basic_entity(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "ghg")["gri"] = "305"
    err = _invalid(tmp_path, data)
    assert err.entity_id == "ghg"
    assert "gri is only for basic entities" in str(err)


def test_gri_none_and_numeric_gri_are_accepted(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "gri-305")["gri"] = 305  # an unquoted YAML number
    data["entities"].append(
        {
            "id": "climate-change",
            "level": "basic",
            "gri": "GRI_none",
            "name": "Climate change",
            "definition": "Warming.",
            "parents": {"env": "contains"},
        }
    )
    graph = load_graph(_write(tmp_path, data))
    assert graph.entity("gri-305").gri_id == "GRI 305"
    assert graph.entity("climate-change").gri_id == "GRI_none"
    assert graph.gri_topic("305") is graph.entity("gri-305")


def test_alias_shared_by_two_entities(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["aliases"] = ["Greenhouse  GASES"]
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "already used by 'ghg'" in str(err)


def test_unknown_field_and_bad_id(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["alias"] = ["typo"]
    err = _invalid(tmp_path, data)
    assert err.entity_id == "co2"
    assert "unknown field(s) alias" in str(err)
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["id"] = "CO2_Gas"
    err = _invalid(tmp_path, data)
    assert "kebab-case" in str(err)


def test_version_must_be_a_string(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["version"] = 1.0
    err = _invalid(tmp_path, data)
    assert "'version'" in str(err)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="cannot read graph file"):
        load_graph(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("entities: [unclosed\n")
    with pytest.raises(GraphError, match="not valid YAML"):
        load_graph(bad)


def test_from_mapping_validates_without_a_file() -> None:
    graph = KnowledgeGraph.from_mapping(copy.deepcopy(BASE))
    assert graph.children("ghg") == ["co2"]
    data = copy.deepcopy(BASE)
    _entity(data, "co2")["parents"] = {}
    with pytest.raises(GraphError, match="'co2': does not reach the root"):
        KnowledgeGraph.from_mapping(data)


# ------------------------------------------------------------- kg stats


def test_kg_stats_prints_aligned_counts_and_version(graph: KnowledgeGraph) -> None:
    result = CliRunner().invoke(kg, ["stats"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"ESG knowledge graph {graph.version} (esg_graph.yaml)"
    stats = graph.stats()
    rows = {
        line.split()[0]: int(line.split()[1])
        for line in lines
        if len(line.split()) == 2 and line.split()[1].isdigit()
    }
    for name, count in {**stats["levels"], **stats["relations"]}.items():
        assert rows[name] == count
    assert f"total              {len(graph.entities)}" in result.output
    # Counts are right-aligned under their header in each table.
    level_block = lines[
        lines.index("level         entities") : lines.index("level         entities") + 8
    ]
    assert len({len(line) for line in level_block}) == 1
    assert result.output.rstrip("\n") == format_stats(graph)


def test_kg_stats_json(graph: KnowledgeGraph) -> None:
    result = CliRunner().invoke(kg, ["stats", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output) == {"version": graph.version, **graph.stats()}


def test_kg_stats_rejects_an_invalid_graph(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    del _entity(data, "ghg")["parents"]
    result = CliRunner().invoke(kg, ["stats", "--graph", str(_write(tmp_path, data))])
    assert result.exit_code == 1
    assert "invalid knowledge graph" in result.output
    assert "'ghg': does not reach the root" in result.output
    result = CliRunner().invoke(kg, ["stats", "--graph", str(_write(tmp_path, BASE))])
    assert result.exit_code == 0
    assert "ESG knowledge graph 0.0.1" in result.output
