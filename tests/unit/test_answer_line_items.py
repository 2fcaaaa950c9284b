"""The answer service's line-item search for a metric question: of the passages
BM25 returns for a line item, those holding a row of that item come first, so
a note or a cash flow row that repeats the label's words cannot push the
statement's own row out of the sources."""

from __future__ import annotations

from typing import Any

from attest.answer.options import validate
from attest.answer.pipeline import AnswerPipeline, collect
from attest.common.v1 import common_pb2
from attest.core.settings import RequestLimits
from attest.lexical.convert import search_from_proto
from attest.lexical.v1 import lexical_pb2
from tests.unit.test_answer_knowledge import Backends, options, settings

QUESTION = "What is Halver's year end FY2018 net property, plant, and equipment (in USD millions)?"
DOC = "HALVER_2018_10K"
ROW = (
    "Consolidated Statements of Financial Position (Dollars in millions): Property, plant and "
    "equipment, net | December 31, 2018: 12,645; 2017: 12,672."
)
# What BM25 ranks above the row: passages full of the label's words, none of
# them a row of net property, plant and equipment.
NEARBY = [
    "Consolidated Statements of Cash Flows (Dollars in millions): Property, plant and equipment "
    "additions | December 31, 2018: (1,722); 2017: (1,739).",
    "Property, plant and equipment, net of accumulated depreciation, are reviewed for "
    "impairment; property, plant and equipment held for sale are measured at fair value.",
    "Fair value (Level 3): Property, plant and equipment | 2018: 44; 2017: (4).",
    "Depreciation of property, plant and equipment was $2,114 million in 2018 and $2,047 "
    "million in 2017.",
    "Net property, plant and equipment by segment is shown in Note 21 for 2018 and 2017.",
]


class Filing(Backends):
    """One filing: BM25 by the question finds its prose; the line-item search
    returns the five passages above and then (when given) the balance sheet's row."""

    def __init__(self, found: list[str]) -> None:
        super().__init__()
        self.found = found

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        if request.level == lexical_pb2.SEARCH_LEVEL_DOCUMENT:
            hit = lexical_pb2.Hit(doc_id=DOC, passage_index=-1, score=2.0, title=DOC, text="")
            return lexical_pb2.SearchResponse(hits=[hit])
        if not request.query.startswith(DOC):
            prose = "Halver builds aircraft and reports its property in Note 8."
            hit = lexical_pb2.Hit(doc_id=DOC, passage_index=0, score=3.0, title=DOC, text=prose)
            return lexical_pb2.SearchResponse(hits=[hit])
        self.lookups.append(request)
        texts = self.found
        return lexical_pb2.SearchResponse(
            hits=[
                lexical_pb2.Hit(
                    doc_id=DOC, passage_index=10 + i, score=50.0 - i, title=DOC, text=text
                )
                for i, text in enumerate(texts)
            ]
        )


async def _sources(found: list[str], **overrides: Any) -> list[str]:
    fake = Filing(found)
    config = settings(**overrides)
    plan = validate(QUESTION, options(common_pb2.RETRIEVER_BM25), config, deadline_seconds=None)
    await collect(AnswerPipeline(fake, config).run(plan))
    (request,) = fake.generated
    (lookup,) = fake.lookups
    assert lookup.query.startswith(f"{DOC} balance sheets financial position")
    # Searched within the filing alone, however many others the store holds.
    assert [(f.field, list(f.any_of)) for f in lookup.filters] == [("doc_id", [DOC])]
    return [s.text for s in request.sources]


async def test_the_row_of_the_line_item_is_kept_though_bm25_ranks_it_sixth() -> None:
    texts = await _sources([*NEARBY, ROW], numeric_search_keep=5)
    assert ROW in texts
    # The row first among what the line-item search added, then the others in
    # BM25's order up to the five kept.
    added = texts[texts.index(ROW) :]
    assert added == [ROW, *NEARBY[:4]]


async def test_without_a_row_of_the_item_the_search_order_stands() -> None:
    texts = await _sources(NEARBY, numeric_search_keep=3)
    assert ROW not in texts
    assert texts[-3:] == NEARBY[:3]


class CheckedFiling(Filing):
    """The filing behind a lexical service that checks each search as the real
    one does (``search_from_proto``): at most ``max_filters`` filters."""

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        search_from_proto(request, RequestLimits())
        return await super().lexical_search(request, seconds)


async def test_a_question_with_as_many_filters_as_allowed_still_gets_its_rows() -> None:
    # The answer service allows as many filters as the lexical service; the
    # line-item search must not add one more and have its searches refused.
    config = settings(numeric_search_keep=5)
    assert config.limits.max_filters == RequestLimits().max_filters
    opts = options(common_pb2.RETRIEVER_BM25)
    opts.retrieval.filters.extend(
        common_pb2.Filter(field="language", any_of=["en"]) for _ in range(config.limits.max_filters)
    )
    fake = CheckedFiling([*NEARBY, ROW])
    plan = validate(QUESTION, opts, config, deadline_seconds=None)
    await collect(AnswerPipeline(fake, config).run(plan))
    (request,) = fake.generated
    (lookup,) = fake.lookups
    assert len(lookup.filters) <= RequestLimits().max_filters
    assert [list(f.any_of) for f in lookup.filters if f.field == "doc_id"] == [[DOC]]
    assert ROW in [s.text for s in request.sources]
