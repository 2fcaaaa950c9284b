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


def provenance_to_proto(p: kb.Provenance) -> knowledge_pb2.Provenance:
    return knowledge_pb2.Provenance(
        passage_index=p.passage_index, start_char=p.start_char, end_char=p.end_char
    )


def provenance_from_proto(p: knowledge_pb2.Provenance, present: bool) -> kb.Provenance:
    if not present:
        return kb.NO_PROVENANCE
    return kb.Provenance(p.passage_index, p.start_char, p.end_char)


def _provenance(fact: kb.Triple | kb.Description | kb.AspectFact) -> dict[str, object]:
    """The provenance field of a personal fact (the ESG graph's facts have none)."""
    if not fact.source_doc_id:
        return {}
    return {"provenance": provenance_to_proto(fact.provenance)}


def triple_to_proto(triple: kb.Triple) -> knowledge_pb2.Triple:
    out = knowledge_pb2.Triple(
        subject=ref_to_proto(triple.subject),
        relation=triple.relation,
        knowledge_base=base_to_proto(triple.knowledge_base),
        source_doc_id=triple.source_doc_id,
        **_provenance(triple),  # type: ignore[arg-type]
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
        **_provenance(description),  # type: ignore[arg-type]
    )


def aspect_to_proto(fact: kb.AspectFact) -> knowledge_pb2.AspectFact:
    return knowledge_pb2.AspectFact(
        entity=ref_to_proto(fact.entity),
        aspect=fact.aspect,
        value=fact.value,
        knowledge_base=base_to_proto(fact.knowledge_base),
        source_doc_id=fact.source_doc_id,
        **_provenance(fact),  # type: ignore[arg-type]
    )


def fact_to_proto(fact: kb.Fact) -> knowledge_pb2.Fact:
    if fact.triple is not None:
        return knowledge_pb2.Fact(triple=triple_to_proto(fact.triple), score=fact.score)
    if fact.aspect_fact is not None:
        return knowledge_pb2.Fact(aspect_fact=aspect_to_proto(fact.aspect_fact), score=fact.score)
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
        chosen_entity_ids=list(linking.chosen_ids),
    )


def info_to_proto(info: kb.EntityInfo) -> knowledge_pb2.GetEntityInfoResponse:
    return knowledge_pb2.GetEntityInfoResponse(
        entity=entity_to_proto(info.entity),
        descriptions=[description_to_proto(d) for d in info.descriptions],
        triples=[triple_to_proto(t) for t in info.triples],
        aspect_facts=[aspect_to_proto(a) for a in info.aspect_facts],
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


def _unlinked(ref: kb.EntityRef) -> knowledge_pb2.EntityRef:
    # A personal id is the server's to give: by name, the server finds or creates it.
    return knowledge_pb2.EntityRef(name=ref.name)


def store_request(
    doc_id: str, facts: list[kb.Description | kb.Triple | kb.AspectFact]
) -> knowledge_pb2.StoreRequest:
    """A Store request for a document's facts (entities named, not given ids)."""
    request = knowledge_pb2.StoreRequest(source_doc_id=doc_id)
    for fact in facts:
        provenance = provenance_to_proto(fact.provenance)
        if isinstance(fact, kb.Description):
            request.descriptions.append(
                knowledge_pb2.Description(
                    entity=_unlinked(fact.entity), text=fact.text, provenance=provenance
                )
            )
        elif isinstance(fact, kb.Triple):
            triple = knowledge_pb2.Triple(
                subject=_unlinked(fact.subject), relation=fact.relation, provenance=provenance
            )
            if fact.object_entity is not None:
                triple.object_entity.CopyFrom(_unlinked(fact.object_entity))
            else:
                triple.object_value = fact.object_value or ""
            request.triples.append(triple)
        else:
            request.aspect_facts.append(
                knowledge_pb2.AspectFact(
                    entity=_unlinked(fact.entity),
                    aspect=fact.aspect,
                    value=fact.value,
                    provenance=provenance,
                )
            )
    return request
