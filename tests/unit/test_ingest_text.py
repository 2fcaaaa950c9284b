"""Ingestion text processing: passages, validation, normalization, ids, organizations, summaries."""

from __future__ import annotations

import json

import pytest

from attest.ingest.documents import (
    MAX_BODY_BYTES,
    FailureCode,
    ItemError,
    article_from_raw_json,
    content_hash,
    normalize_text,
    passage_id,
)
from attest.ingest.organizations import Gazetteer, PatternRecognizer
from attest.ingest.passages import CHARS_PER_TOKEN, count_tokens, sentence_spans, split_passages
from attest.ingest.readers import html_to_text, read_path
from attest.ingest.summary import extractive_summary


def _sentence(i: int, words: int) -> str:
    return " ".join(f"word{i}x{j}" for j in range(words - 1)) + " end."


def test_passages_keep_whole_sentences_under_the_limit():
    text = " ".join(_sentence(i, 30) for i in range(20))  # 20 sentences of 31 tokens
    passages = split_passages(text, max_tokens=100)
    # 3 sentences (93 tokens) fit, a 4th would not.
    assert [count_tokens(p.text) for p in passages] == [93] * 6 + [62]
    for p in passages:
        assert text[p.start_char : p.end_char] == p.text
        assert p.text.endswith("end.")
    assert [p.index for p in passages] == list(range(7))
    assert " ".join(p.text for p in passages) == text


def test_a_sentence_longer_than_the_limit_is_cut_at_words():
    text = "Short one. " + " ".join(f"w{j}" for j in range(450)) + ". Tail sentence."
    passages = split_passages(text, max_tokens=200)
    assert all(count_tokens(p.text) <= 200 for p in passages)
    # The long sentence does not share a passage with its 3-token neighbour:
    # its first 200-token piece would not fit next to it.
    assert passages[0].text == "Short one."
    assert passages[1].text.startswith("w0 w1")
    assert count_tokens(passages[1].text) == 200
    assert passages[-1].text.endswith("Tail sentence.")
    assert all(text[p.start_char : p.end_char] == p.text for p in passages)


def test_a_run_without_spaces_is_cut_to_the_character_cap():
    """An inlined image counts as a handful of tokens; stored whole it would be
    one passage longer than the reranker and the generator accept."""
    import base64
    import random

    blob = base64.b64encode(random.Random(7).randbytes(16_000)).decode()
    text = f"The centrifuge spins at 15000 rpm. ![plot](data:image/png;base64,{blob}) Done."
    passages = split_passages(text, max_tokens=200)
    assert passages[0].text == "The centrifuge spins at 15000 rpm."
    assert max(len(p.text) for p in passages) <= CHARS_PER_TOKEN * 200
    assert all(text[p.start_char : p.end_char] == p.text for p in passages)
    assert "".join(p.text for p in passages[1:]).replace(" ", "") == text[35:].replace(" ", "")
    # Ordinary prose never meets the cap: 200-token passages of it are far shorter.
    prose = " ".join(_sentence(i, 30) for i in range(40))
    assert [count_tokens(p.text) for p in split_passages(prose)] == [186] * 6 + [124]


def test_chinese_and_japanese_count_by_character_and_end_at_full_stops():
    sentence = "这是一个测试句子，用来检查分段。"  # 16 characters, 16 tokens
    assert count_tokens(sentence) == 16
    assert count_tokens("abc中文def") == 4
    passages = split_passages(sentence * 40, max_tokens=200)
    # Whole sentences (12 of 16 tokens) per passage, as for any language.
    assert [count_tokens(p.text) for p in passages] == [192, 192, 192, 64]
    assert all(p.text.endswith("。") for p in passages)
    # A run of stops ends one sentence; a stop inside a quote ends none.
    text = "本当ですか？！そうです。「はい。」と言った。"
    assert [text[a:b] for a, b in sentence_spans(text)] == [
        "本当ですか？！",
        "そうです。",
        "「はい。」と言った。",
    ]
    # A run without a full stop is cut at characters, within the token budget.
    run = "没有句号的长句子" * 100
    assert [len(p.text) for p in split_passages(run, max_tokens=200)] == [200] * 4


def test_blank_text_has_no_passages_and_bad_limits_are_rejected():
    assert split_passages("  \n\n ") == []
    with pytest.raises(ValueError, match="max_tokens"):
        split_passages("x", max_tokens=0)


def test_normalization_joins_wraps_and_keeps_paragraphs():
    raw = "Showers continued\nthroughout the week.\n    The dry\tperiod  means\r\nlate.\x00"
    assert (
        normalize_text(raw)
        == "Showers continued throughout the week.\n\nThe dry period means late."
    )
    assert normalize_text("- a\n- b") == "- a\n- b"


def test_bodies_without_a_form_feed_normalize_and_hash_as_before_pages():
    """Pinned outputs of the normalization before page breaks were kept: every
    stored document's content hash depends on them (all 21,578 Reuters bodies
    of ../shared/data normalize byte for byte as before, checked once)."""
    raw = (
        "  Showers continued\nthroughout the week.\n    The dry\tperiod  means\r\nlate."
        "\x00\x0b\u200b  \n\n\n- a\n- b\n 1. one\n\ufeffEnd "
    )
    assert normalize_text(raw) == (
        "Showers continued throughout the week.\n\nThe dry period means late.\n\n"
        "- a\n- b\n\n1. one End"
    )
    assert normalize_text("Cafe\u0301 au lait.\r\rNext\xa0para.") == "Café au lait.\n\nNext para."
    article = article_from_raw_json(
        json.dumps(
            {
                "id": "r1",
                "title": "BAHIA COCOA REVIEW",
                "body": raw,
                "published_at": "1987-02-26T15:01:01Z",
                "organizations": ["Comissaria Smith"],
            }
        ).encode()
    )
    assert content_hash(article) == "59581be3677400cb2afa15169cc2af88"


def test_form_feeds_survive_normalization_as_page_breaks():
    # pdftotext: page 1, form feed, page 2, ...; each page normalized on its own.
    raw = "Page one\nwrapped.\n\n\n\f  Page two.  \f\f \n \fPage five\x00 text.\f\f"
    body = normalize_text(raw)
    # A page with text is a paragraph of its own; an empty page keeps its break,
    # so page five is still the fifth; empty pages at the end go.
    assert body == "Page one wrapped.\n\n\f\n\nPage two.\n\n\f\f\f\n\nPage five text."
    assert body.count("\f") == 4
    # An empty first page starts the body with its break: the text is on page 2.
    assert normalize_text("\f\nCover text.") == "\f\n\nCover text."
    # Other control characters still go, and pages with no text at all are no body.
    assert normalize_text("a\x0bb\fc") == "ab\n\n\f\n\nc"
    assert normalize_text("\f \n\f") == ""
    with pytest.raises(ItemError) as empty:
        article_from_raw_json(json.dumps({"id": "p", "body": " \f\f"}).encode())
    assert empty.value.code is FailureCode.EMPTY_BODY


def test_passages_never_cross_a_page_and_know_their_page():
    page = " ".join(_sentence(i, 10) for i in range(3))  # 3 sentences of 11 tokens
    body = normalize_text(f"{page}\f{page}\f\f{page} Last words without a stop")
    passages = split_passages(body, max_tokens=30)
    # Two sentences fit a passage; the third would fit beside the next page's
    # first, but a page break ends the passage.
    assert [(p.page, count_tokens(p.text)) for p in passages] == [
        (1, 22),
        (1, 11),
        (2, 22),
        (2, 11),
        (4, 22),
        (4, 16),
    ]
    assert [p.index for p in passages] == list(range(6))
    for p in passages:
        assert body[p.start_char : p.end_char] == p.text
        assert "\f" not in p.text
        assert p.page == body.count("\f", 0, p.start_char) + 1
    # Even without the blank lines of a normalized body, and without punctuation.
    raw = "first page\fsecond page. More\f"
    assert [(p.text, p.page) for p in split_passages(raw)] == [
        ("first page", 1),
        ("second page. More", 2),
    ]
    assert [raw[a:b] for a, b in sentence_spans(raw)] == ["first page", "second page.", "More"]


def test_a_text_without_page_breaks_has_passages_on_page_zero():
    text = " ".join(_sentence(i, 30) for i in range(5))
    assert {p.page for p in split_passages(text, max_tokens=100)} == {0}


@pytest.mark.parametrize(
    ("raw", "code", "doc_id", "reason"),
    [
        (b'{"id": "a", "body": "x"', FailureCode.INVALID_JSON, "", "malformed JSON"),
        (b"[1, 2]", FailureCode.INVALID_JSON, "", "expected a JSON object"),
        (b'{"title": "t", "body": "b"}', FailureCode.MISSING_ID, "", "id: missing"),
        (b'{"id": "", "body": "b"}', FailureCode.MISSING_ID, "", "id: missing"),
        (b'{"id": ["x"], "body": "b"}', FailureCode.INVALID_ID, "", "id: must be a string"),
        (json.dumps({"id": "x" * 300, "body": "b"}).encode(), FailureCode.INVALID_ID, "", "256"),
        (b'{"id": "e", "body": "  \\n "}', FailureCode.EMPTY_BODY, "e", "body: is empty"),
        (b'{"id": "e2"}', FailureCode.EMPTY_BODY, "e2", "body: is empty"),
        (
            b'{"id": "d", "body": "b", "published_at": "31/12/2024"}',
            FailureCode.INVALID_DATE,
            "d",
            "published_at",
        ),
        (b'{"id": "u", "body": "caf\xe9"}', FailureCode.INVALID_UTF8, "", "not valid UTF-8"),
        (b'{"id": "f", "body": 5}', FailureCode.INVALID_FIELD, "f", "body: must be a string"),
        (
            b'{"id": "o", "body": "b", "organizations": "Acme"}',
            FailureCode.INVALID_FIELD,
            "o",
            "organizations",
        ),
    ],
)
def test_bad_records_are_rejected_with_code_id_and_reason(raw, code, doc_id, reason):
    with pytest.raises(ItemError) as info:
        article_from_raw_json(raw)
    assert info.value.code is code
    assert info.value.doc_id == doc_id
    assert reason in info.value.reason


def test_a_body_over_the_limit_is_too_large():
    raw = json.dumps({"id": "big", "body": "a" * (MAX_BODY_BYTES + 1)}).encode()
    with pytest.raises(ItemError) as info:
        article_from_raw_json(raw)
    assert info.value.code is FailureCode.BODY_TOO_LARGE
    assert info.value.doc_id == "big"


def test_beir_keys_dates_and_ids():
    a = article_from_raw_json(
        b'{"_id": 7, "title": " A  title ", "text": "Body.", "published_at": "2024-05-31"}'
    )
    assert (a.id, a.title, a.body) == ("7", "A title", "Body.")
    assert a.published_at is not None
    assert a.published_at.isoformat() == "2024-05-31T00:00:00+00:00"
    same = article_from_raw_json(
        b'{"id": "7", "title": "A title", "body": "Body.\\n", "published_at": "2024-05-31T00:00Z"}'
    )
    assert content_hash(a) == content_hash(same)
    changed = article_from_raw_json(b'{"id": "7", "title": "A title", "body": "Body 2."}')
    assert content_hash(changed) != content_hash(a)
    assert passage_id("t", "7", content_hash(a), 0) == passage_id("t", "7", content_hash(a), 0)
    assert passage_id("t", "7", content_hash(a), 0) != passage_id("t", "7", content_hash(a), 1)
    assert passage_id("t", "7", content_hash(a), 0) != passage_id("u", "7", content_hash(a), 0)


def test_organizations_by_shape_and_from_a_growing_gazetteer():
    recognizer = PatternRecognizer(Gazetteer())
    first = recognizer.recognize(
        "Texaco Inc cuts crude prices", "The Bank of Japan said it would hold rates."
    )
    assert "Texaco Inc" in first
    assert "Bank of Japan" in first
    # The stem of a name seen before is found in a later article.
    later = recognizer.recognize("Output", "Texaco said refinery output rose. The texaco brand")
    assert later == ["Texaco Inc"]
    assert recognizer.recognize("Nothing", "prices rose in the morning.") == []


def test_gazetteer_matches_whole_words_only():
    g = Gazetteer(["Acme Holdings", "BP"])
    assert g.find("Acme Holdings and BP agreed; BPX did not.") == ["Acme Holdings", "BP"]
    assert g.find("acme holdings") == []


def test_extractive_summary_picks_central_sentences_in_order():
    body = (
        "Acme cut its water use by a fifth at its plants. "
        "The weather was mild. "
        "Water use at Acme plants fell because of recycling. "
        "A spokesman declined to comment on football. "
        "Recycling of water at the plants will continue."
    )
    summary = extractive_summary(body, max_sentences=2)
    assert summary == (
        "Acme cut its water use by a fifth at its plants. "
        "Water use at Acme plants fell because of recycling."
    )
    assert extractive_summary("One sentence.", 3) == "One sentence."


def test_readers_jsonl_lines_folders_and_html(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Heading A\n\nText of a.", encoding="utf-8")
    (tmp_path / "docs" / "b.html").write_text(
        "<html><head><title>Page B</title><style>x{}</style></head>"
        "<body><p>First.</p><p>Second &amp; last.</p></body></html>",
        encoding="utf-8",
    )
    (tmp_path / "docs" / "c.txt").write_bytes(b"caf\xe9")
    (tmp_path / "docs" / "skip.bin").write_bytes(b"x")
    items = list(read_path(tmp_path / "docs"))
    assert [i.origin for i in items] == ["a.md", "b.html", "c.txt"]
    a = json.loads(items[0].raw_json)
    assert (a["id"], a["title"]) == ("a.md", "Heading A")
    b = json.loads(items[1].raw_json)
    assert (b["title"], b["body"]) == ("Page B", "First.\n\nSecond & last.")
    with pytest.raises(ItemError) as info:
        article_from_raw_json(items[2].raw_json)
    assert info.value.code is FailureCode.INVALID_UTF8
    assert html_to_text("<p>x</p>") == ("", "x")
    lines = tmp_path / "n.jsonl"
    lines.write_bytes(b'{"id": "1", "body": "x"}\n\n{"id": "2", "body": "y"}\n')
    assert [i.origin for i in read_path(lines)] == ["n.jsonl:1", "n.jsonl:3"]


def test_readers_take_byte_order_marks_headings_and_leave_hidden_files_out(tmp_path):
    from attest.ingest.readers import count_items, skipped_files

    docs = tmp_path / "docs"
    (docs / ".git").mkdir(parents=True)
    (docs / ".git" / "notes.txt").write_text("the vault code is 1234", encoding="utf-8")
    (docs / ".env.md").write_text("SECRET=1", encoding="utf-8")
    (docs / "ferry.md").write_bytes(
        b"\xef\xbb\xbf# Glimmer Lake\nThe ferry carries 340 passengers.\n## Fares ##\nA ticket is 5."
    )
    (docs / "c.txt").write_bytes(b"\xef\xbb\xbfPlain text.")
    items = list(read_path(docs))
    assert [i.origin for i in items] == ["c.txt", "ferry.md"]
    assert count_items(docs) == len(items)
    assert skipped_files(docs) == []
    text = json.loads(items[0].raw_json)
    assert text["body"] == "Plain text."
    md = article_from_raw_json(items[1].raw_json)
    assert md.title == "Glimmer Lake"
    # Headings are paragraphs of their own, without their marks.
    assert "#" not in md.body
    assert "Glimmer Lake\n\nThe ferry carries 340 passengers." in md.body
    assert "Fares\n\nA ticket is 5." in md.body
    # A comment in a fenced code block is code, not a heading (nor the title).
    (docs / "setup.md").write_text(
        "```bash\n# install deps\npip install x\n```\n# Setup\nRun it.\n", encoding="utf-8"
    )
    setup = article_from_raw_json(
        next(i for i in read_path(docs) if i.origin == "setup.md").raw_json
    )
    assert setup.title == "Setup"
    assert "# install deps pip install x" in setup.body
    # A fence line with an info string opens a block; only a bare one closes it.
    (docs / "two.md").write_text(
        "```python\n# c\n```bash\n# inside\n```\n# After\nText.\n", encoding="utf-8"
    )
    two = article_from_raw_json(next(i for i in read_path(docs) if i.origin == "two.md").raw_json)
    assert two.title == "After"
    assert "# inside" in two.body
    lines = tmp_path / "bom.jsonl"
    lines.write_bytes(b'\xef\xbb\xbf{"id": "1", "body": "x"}\n{"id": "2", "body": "y"}\n')
    assert [article_from_raw_json(i.raw_json).id for i in read_path(lines)] == ["1", "2"]


class CountingEncoder:
    """A stand-in model: a text's vector is a hash of it; records what it was given."""

    name = "counting"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode(self, texts):
        import numpy as np

        self.calls.append(list(texts))
        out = np.zeros((len(texts), 8), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, hash(t) % 8] = 1.0
        return out


def test_embedding_encodes_each_distinct_text_once_and_maps_vectors_back():
    from attest.ingest.settings import EnrichSettings
    from attest.ingest.stages import Embedding, Enricher, decode_vector, record_passages
    from attest.semantic.models import passage_text

    enricher = Enricher(EnrichSettings())
    short = article_from_raw_json(
        b'{"id": "s", "title": "Cocoa", "body": "Cocoa rose.\\n\\nBahia."}'
    )
    long_body = " ".join(_sentence(i, 40) for i in range(12))
    long = article_from_raw_json(json.dumps({"id": "l", "title": "T", "body": long_body}).encode())
    records = [enricher.enrich(0, "created", "h", short), enricher.enrich(1, "created", "h", long)]
    encoder = CountingEncoder()
    out = Embedding.build(encoder, None).embed(records)
    (call,) = encoder.calls
    assert len(call) == len(set(call))
    # The short article's text is its only passage's: one row serves both.
    assert out[0]["article_vector"] == out[0]["passage_vectors"][0]
    for record in out:
        title = record["article"]["title"]
        for passage, vector in zip(record_passages(record), record["passage_vectors"], strict=True):
            expected = encoder.encode([passage_text(title, passage.text)])[0]
            assert (decode_vector(vector) == expected).all()
    assert len(out[1]["passages"]) == 3


def test_keyphrases_embedded_for_one_batch_are_not_embedded_again_for_the_next():
    from attest.ingest.settings import EnrichSettings
    from attest.ingest.stages import Embedding, Enricher
    from attest.knowledge.graph import load_graph
    from attest.semantic.embedding import Embedder

    class Recording:
        name = "all-MiniLM-L6-v2"

        def __init__(self) -> None:
            self.model = Embedder()
            self.calls: list[list[str]] = []

        def encode(self, texts):
            self.calls.append(list(texts))
            return self.model.encode(texts)

    body = (
        "Corliss Garment Works cut its greenhouse gas emissions and water withdrawal "
        "after an audit found child labour at a supplier. Union members welcomed the "
        "audit of carbon dioxide emissions."
    )
    enricher = Enricher(EnrichSettings())
    first = enricher.enrich(
        0,
        "created",
        "h",
        article_from_raw_json(
            json.dumps({"id": "a", "title": "Audit at Corliss", "body": body}).encode()
        ),
    )
    second = enricher.enrich(
        0,
        "created",
        "h",
        article_from_raw_json(
            json.dumps({"id": "b", "title": "Audit at Corliss", "body": body}).encode()
        ),
    )
    encoder = Recording()
    embedding = Embedding.build(encoder, load_graph(None))
    embedding.warm_up()
    encoder.calls.clear()
    assert embedding._cached is not None
    # Warm-up embedded the entity names, a keyphrase may be one of them.
    known = set(embedding._cached.cache)
    (a,) = embedding.embed([first])
    (b,) = embedding.embed([second])
    phrases = set(first["keyphrases"])
    assert phrases - known
    assert phrases - known <= set(encoder.calls[0])
    # The second batch embeds its passage and article text only.
    assert not phrases & set(encoder.calls[1])
    assert a["entity_ids"]
    assert a["entity_ids"] == b["entity_ids"]


def test_the_keyphrase_cache_is_bounded_and_keeps_the_recently_used():
    import numpy as np

    from attest.ingest.stages import _CachedEncode

    cache = _CachedEncode(CountingEncoder(), capacity=3)
    cache(["a", "b", "c"])
    cache(["a"])  # a is now the most recent
    cache(["d"])
    assert list(cache.cache) == ["c", "a", "d"]
    assert cache.missing(["a", "b", "d", "b"]) == ["b"]
    assert np.array_equal(cache(["d"]), CountingEncoder().encode(["d"]))
