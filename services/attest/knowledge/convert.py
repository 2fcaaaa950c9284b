"""Knowledge-base values to and from the knowledge proto (no service logic)."""

from __future__ import annotations

import json
from typing import Final

from google.protobuf.duration_pb2 import Duration

from attest.common.v1 import common_pb2
from attest.knowledge import kb
from attest.knowledge.plans import ProgramRun, StepResult
from attest.knowledge.v1 import knowledge_pb2

_BASES: Final = {
    kb.ESG_GRAPH: knowledge_pb2.KNOWLEDGE_BASE_ESG_GRAPH,
    kb.PERSONAL: knowledge_pb2.KNOWLEDGE_BASE_PERSONAL,
}
_LEVELS: Final = {
    "root": common_pb2.KG_NODE_LEVEL_ROOT,
    "pillar": common_pb2.KG_NODE_LEVEL_PILLAR,
    "basic": common_pb2.KG_NODE_LEVEL_BASIC,
    "intermediate": common_pb2.KG_NODE_LEVEL_INTERMEDIATE,
    "lower": common_pb2.KG_NODE_LEVEL_LOWER,
}
_MATCHES: Final = {
    "exact": knowledge_pb2.MATCH_KIND_EXACT,
    "embedding": knowledge_pb2.MATCH_KIND_EMBEDDING,
}


def base_to_proto(name: str) -> knowledge_pb2.KnowledgeBase.ValueType:
    return _BASES.get(name, knowledge_pb2.KNOWLEDGE_BASE_UNSPECIFIED)


def entity_to_proto(entity: kb.KbEntity) -> knowledge_pb2.Entity:
    return knowledge_pb2.Entity(
        id=entity.id,
        name=entity.name,
        aliases=list(entity.aliases),
        definition=entity.definition,
        knowledge_base=base_to_proto(entity.knowledge_base),
        level=_LEVELS.get(entity.level or "", common_pb2.KG_NODE_LEVEL_UNSPECIFIED),
        gri_id=entity.gri_id or "",
    )


def ref_to_proto(ref: kb.EntityRef) -> knowledge_pb2.EntityRef:
    return knowledge_pb2.EntityRef(id=ref.id, name=ref.name)


def triple_to_proto(triple: kb.Triple) -> knowledge_pb2.Triple:
    out = knowledge_pb2.Triple(
        subject=ref_to_proto(triple.subject),
        relation=triple.relation,
        knowledge_base=base_to_proto(triple.knowledge_base),
        source_doc_id=triple.source_doc_id,
    )
    if triple.object_entity is not None:
        out.object_entity.CopyFrom(ref_to_proto(triple.object_entity))
    elif triple.object_value is not None:
        out.object_value = triple.object_value
    return out


def description_to_proto(description: kb.Description) -> knowledge_pb2.Description:
    return knowledge_pb2.Description(
        entity=ref_to_proto(description.entity),
        text=description.text,
        knowledge_base=base_to_proto(description.knowledge_base),
        source_doc_id=description.source_doc_id,
    )


def fact_to_proto(fact: kb.Fact) -> knowledge_pb2.Fact:
    if fact.triple is not None:
        return knowledge_pb2.Fact(triple=triple_to_proto(fact.triple), score=fact.score)
    assert fact.description is not None
    return knowledge_pb2.Fact(description=description_to_proto(fact.description), score=fact.score)


def linking_to_proto(linking: kb.Linking) -> knowledge_pb2.MentionLinks:
    return knowledge_pb2.MentionLinks(
        mention=linking.mention,
        candidates=[
            knowledge_pb2.EntityCandidate(
                entity=entity_to_proto(c.entity),
                match=_MATCHES[c.match],
                score=c.score,
                matched_name=c.matched_name,
            )
            for c in linking.candidates
        ],
        chosen_entity_id=linking.chosen or "",
    )


def info_to_proto(info: kb.EntityInfo) -> knowledge_pb2.GetEntityInfoResponse:
    return knowledge_pb2.GetEntityInfoResponse(
        entity=entity_to_proto(info.entity),
        descriptions=[description_to_proto(d) for d in info.descriptions],
        triples=[triple_to_proto(t) for t in info.triples],
        truncated=info.truncated,
    )


def path_to_proto(path: kb.RelationPath) -> knowledge_pb2.RelationPath:
    return knowledge_pb2.RelationPath(triples=[triple_to_proto(t) for t in path.triples])


def step_to_proto(step: StepResult) -> knowledge_pb2.ProgramStep:
    duration = Duration()
    duration.FromNanoseconds(int(step.seconds * 1e9))
    return knowledge_pb2.ProgramStep(
        index=step.index,
        op=step.op,
        args_json=json.dumps(step.args, ensure_ascii=False),
        results=step.results,
        error=step.error,
        duration=duration,
    )


def run_to_proto(
    run: ProgramRun,
    facts: list[kb.Fact],
    planner: knowledge_pb2.Planner.ValueType,
    degraded_reason: str = "",
) -> knowledge_pb2.SearchResponse:
    return knowledge_pb2.SearchResponse(
        facts=[fact_to_proto(f) for f in facts],
        program=run.program.dumps(),
        planner=planner,
        steps=[step_to_proto(s) for s in run.steps],
        degraded_reason=degraded_reason,
    )
