"""Linking articles to the ESG graph: RAKE keyphrases matched to entities.

An article attaches to the graph in two ways (the KG-RAG method):

* ``Contained_in``: RAKE keyphrases of the headline and body are embedded and
  compared with the embedding of every name and alias of the basic,
  intermediate and lower-level entities; each keyphrase links the article to
  the entity of its most similar name or alias when the cosine similarity
  reaches the threshold, and each linked entity keeps its best keyphrase.
* ``HAS_Org``: the article's organizations, normalised.

Everything here works offline: rake-nltk would otherwise fetch NLTK's stopword
list and punkt tokenizer, so the stopwords and both tokenizers are our own.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from attest.knowledge.graph import KnowledgeGraph, Level

Vectors = npt.NDArray[np.float32]
Encode = Callable[[Sequence[str]], Vectors]

# Cosine similarity (all-MiniLM-L6-v2, unit vectors) a keyphrase needs with
# the name or an alias of its most similar entity to link the article there.
# Chosen by looking at every link of the 48 ESG articles of
# services/attest/demo/sample_corpus.jsonl and of the first 300 Reuters-21578
# articles (1987 business and commodity wire, almost no ESG content), 20
# keyphrases each:
#
#   threshold               0.55   0.60   0.62   0.65   0.68   0.70   0.75
#   sample links/article    6.33   5.06   4.71   4.10   3.60   3.44   2.83
#   sample, no link (/48)      0      0      0      0      0      1      3
#   Reuters links/article   1.57   0.80   0.63   0.39   0.22   0.19   0.12
#   Reuters linked (/300)    209    145    128     88     56     48     32
#
# Between 0.60 and 0.65 the Reuters links are nearly all accidental and the
# sample ones mixed ("capital investments" -> community investment 0.62;
# "budget deficit" -> pension deficit 0.66 is a miss that survives); from
# 0.65 up the sample links are
# mostly right ("long-term renewable power contract" -> renewable energy 0.67,
# "permit limit" -> environmental violation 0.71, "incident happened" ->
# industrial accident 0.68, "allowing improper payments" -> bribery 0.73) and
# the Reuters links that remain are mostly real mentions ("crude oil" 1.00,
# "liquefied natural gas imports" 0.88, "union members" 0.87, "tax laws"
# 0.81). Above 0.70 ESG articles start to lose every link. Hence 0.65.
DEFAULT_THRESHOLD = 0.65

# A one-word keyphrase must (almost) be a name or alias itself: MiniLM puts a
# lone word close to any phrase containing it ("debt" -> "debt bondage" 0.72,
# "shareholders" -> "shareholder rights" 0.78, "union" -> "union organising"
# 0.84), which linked most of Reuters to something. Of the 176 one-word
# Reuters links at 0.6, nine pass 0.9: seven are the word itself or its
# plural ("tax", "taxes", "energy", "strike", "PCBs"), two are near misses
# ("offset" -> "offsets", "disposal" -> "waste disposal").
DEFAULT_SINGLE_WORD_THRESHOLD = 0.9

# Levels whose names and aliases articles link to; the root and the pillars
# are reached through paths, never linked directly.
LINKABLE_LEVELS: tuple[Level, ...] = (Level.BASIC, Level.INTERMEDIATE, Level.LOWER)

# English stopwords for RAKE: function words, auxiliaries, pronouns, and the
# reporting verbs, verbs of rise and fall and units that news wire text is
# full of ("said", "fell", "mln", "pct"). RAKE splits candidate phrases at
# these words, so the list decides how phrases are cut: keep topic words
# (emissions, water, labour) out of it.
_STOPWORD_TEXT = """
    a about above across after afterwards again against ago ahead all almost alone along
    already also although always am among amongst an and another any anyone anything
    anyway anywhere are aren't around as at away back be became because become becomes
    been before beforehand behind being below beside besides between beyond both but by
    can cannot can't could couldn't did didn't do does doesn't doing done don't down
    during each either else elsewhere enough etc even ever every everyone everything
    everywhere except few first for former formerly from further had hadn't has hasn't
    have haven't having he he'd he'll her here hereafter hereby herein here's hers
    herself he's him himself his how however how's i i'd if i'll i'm in indeed instead
    into is isn't it its it's itself i've just last later latter least less let let's
    like likely many may maybe me meanwhile might mine more moreover most mostly much
    must mustn't my myself namely neither never nevertheless next no nobody none noone
    nor not nothing now nowhere of off often on once one only onto or other others
    otherwise ought our ours ourselves out over own per perhaps please put quite rather
    really same say says said saying see seem seemed seeming seems several shall shan't
    she she'd she'll she's should shouldn't since so some somehow someone something
    sometime sometimes somewhere still such than that that's the their theirs them
    themselves then thence there thereafter thereby therefore therein there's these they
    they'd they'll they're they've this those though through throughout thru thus to
    together too toward towards under unless until up upon us very via was wasn't we
    we'd well we'll were we're weren't we've what whatever what's when whence whenever
    when's where whereafter whereas whereby wherein where's whereupon wherever whether
    which while whither who whoever whole whom who's whose why why's will with within
    without won't would wouldn't yet you you'd you'll your you're yours yourself
    yourselves you've told tell tells according added adding announced asked noted
    stated reported reports expects expected want wants wanted make makes made get gets
    got go goes going went take takes took new old around mr mrs ms dr inc corp co ltd
    plc llc mln bln billion million pct percent dlrs dlr cts vs year years month months
    week weeks day days today yesterday tomorrow time times two three four five six
    seven eight nine ten rose rise rises risen fell fall falls fallen jumped climbed
    dropped declined increased decreased grew gained slipped surged plunged soared eased
    edged
"""
ENGLISH_STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

# A sentence ends at ., ! or ? followed by space, or at a blank line; news
# headlines and datelines rarely end with a stop, so titles are passed apart.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
# Words keep inner hyphens, apostrophes and decimal points ("greenhouse-gas",
# "company's", "PM2.5"); any other non-space character is a token of its own.
# A percentage is a quantity, never a topic: it breaks the phrase like
# punctuation ("emissions fell 8% last year").
_TOKEN = re.compile(
    r"(?P<pct>\d+(?:[.,]\d+)*\s?%)"
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?|[^\W_]+(?:[-'’.][^\W_]+)*|[^\w\s]|_"
)
_PHRASE_BREAK = ","
_HAS_LETTER = re.compile(r"[^\W\d_]")
_LEADING_NUMBERS = re.compile(r"^(?:[\d.,]+\s+)+")


def split_sentences(text: str) -> list[str]:
    """Regex sentence splitter (NLTK's punkt needs a download)."""
    return [s for s in (part.strip() for part in _SENTENCE_BREAK.split(text)) if s]


def tokenize_words(sentence: str) -> list[str]:
    """Regex word tokenizer; every punctuation mark becomes a phrase break."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(sentence):
        tok = match.group()
        if match.group("pct") or not (_HAS_LETTER.search(tok) or tok[0].isdigit()):
            tokens.append(_PHRASE_BREAK)
        else:
            tokens.append(tok)
    return tokens


class KeyphraseExtractor:
    """RAKE keyphrases, offline, ranked best first."""

    def __init__(self, *, max_words: int = 5, stopwords: Iterable[str] = ENGLISH_STOPWORDS) -> None:
        self._stopwords = set(stopwords)
        self._max_words = max_words

    def extract(self, text: str, max_phrases: int = 20) -> list[str]:
        """Up to ``max_phrases`` distinct lower-case keyphrases, highest RAKE score first.

        Phrases made only of numbers are dropped; numbers inside a phrase
        stay ("scope 3 emissions").
        """
        if max_phrases <= 0 or not text.strip():
            return []
        # Imported here: rake_nltk imports nltk (2-8 s), which services that
        # never extract keyphrases (and `attest serve all` before SERVING) skip.
        from rake_nltk import Rake

        # A fresh Rake per call: it keeps the last text's state on itself.
        rake = Rake(
            stopwords=self._stopwords,
            max_length=self._max_words,
            sentence_tokenizer=split_sentences,
            word_tokenizer=tokenize_words,
        )
        rake.extract_keywords_from_text(text)
        out: list[str] = []
        seen: set[str] = set()
        for ranked in rake.get_ranked_phrases():
            # A leading count says how much, not what: "63 workers" is about workers.
            phrase = _LEADING_NUMBERS.sub("", ranked)
            if phrase in seen or not _HAS_LETTER.search(phrase):
                continue
            seen.add(phrase)
            out.append(phrase)
            if len(out) == max_phrases:
                break
        return out


@dataclass(frozen=True, slots=True)
class EntityLink:
    """A ``Contained_in`` link: the keyphrase that matched the entity best, and how well."""

    entity_id: str
    keyphrase: str
    score: float


def normalize_organization(name: str) -> str:
    """An organization name with outer space stripped and inner runs collapsed."""
    return " ".join(name.split())


def organization_links(orgs: Iterable[str]) -> list[str]:
    """``HAS_Org`` targets: normalised names, empty ones dropped, case-insensitive duplicates
    dropped (the first spelling wins), order kept."""
    out: list[str] = []
    seen: set[str] = set()
    for org in orgs:
        name = normalize_organization(org)
        key = name.casefold()
        if name and key not in seen:
            seen.add(key)
            out.append(name)
    return out


class EntityLinker:
    """Links articles to graph entities by keyphrase embedding similarity.

    Construction is cheap; ``warm_up`` (or the first ``link``) embeds every
    name and alias of the linkable entities once.
    """

    def __init__(
        self,
        graph: KnowledgeGraph,
        encode: Encode,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        single_word_threshold: float = DEFAULT_SINGLE_WORD_THRESHOLD,
        extractor: KeyphraseExtractor | None = None,
        levels: Sequence[Level] = LINKABLE_LEVELS,
    ) -> None:
        for name, value in (
            ("threshold", threshold),
            ("single_word_threshold", single_word_threshold),
        ):
            if not -1.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a cosine similarity in [-1, 1], got {value}")
        self.graph = graph
        self.threshold = threshold
        self.single_word_threshold = single_word_threshold
        self.extractor = extractor or KeyphraseExtractor()
        self._encode = encode
        self._levels = frozenset(levels)
        self._lock = threading.Lock()
        self._attr_vectors: Vectors | None = None
        # Entity index of each attribute row; rows of one entity are contiguous.
        self._attr_owner: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self._entity_ids: list[str] = []

    def warm_up(self) -> None:
        with self._lock:
            if self._attr_vectors is not None:
                return
            texts: list[str] = []
            owner: list[int] = []
            entity_ids: list[str] = []
            for entity in self.graph.entities.values():
                if entity.level not in self._levels:
                    continue
                attributes = self.graph.attributes(entity.id)
                texts.extend(attributes)
                owner.extend([len(entity_ids)] * len(attributes))
                entity_ids.append(entity.id)
            # The same vectors as the KG scorer's, computed once (see the graph's method).
            vectors = self.graph.attribute_vectors(texts, self._encode)
            self._attr_owner = np.asarray(owner, dtype=np.intp)
            self._entity_ids = entity_ids
            self._attr_vectors = vectors

    @property
    def attribute_count(self) -> int:
        """Number of embedded names and aliases (after ``warm_up``)."""
        self.warm_up()
        return len(self._attr_owner)

    def keyphrases(self, title: str, body: str, max_phrases: int = 20) -> list[str]:
        # The headline is its own sentence: it rarely ends with a full stop.
        return self.extractor.extract(f"{title.strip()}\n\n{body.strip()}", max_phrases)

    def link(self, title: str, body: str, max_phrases: int = 20) -> list[EntityLink]:
        """Links of one article, best score first (ties by entity id)."""
        return self.link_many([(title, body)], max_phrases)[0]

    def link_many(
        self, articles: Sequence[tuple[str, str]], max_phrases: int = 20
    ) -> list[list[EntityLink]]:
        """Links of many ``(title, body)`` articles, with one ``encode`` call for all keyphrases."""
        phrases = [self.keyphrases(title, body, max_phrases) for title, body in articles]
        flat = [p for article in phrases for p in article]
        if not flat:
            return [[] for _ in articles]
        vectors = self._encode_rows(flat)
        out: list[list[EntityLink]] = []
        start = 0
        for article in phrases:
            out.append(self._match(article, vectors[start : start + len(article)]))
            start += len(article)
        return out

    def link_phrases(self, phrases: Sequence[str]) -> list[EntityLink]:
        """Links for given keyphrases (already extracted), best score first."""
        phrases = [p for p in phrases if p.strip()]
        if not phrases:
            return []
        return self._match(phrases, self._encode_rows(phrases))

    def organization_links(self, orgs: Iterable[str]) -> list[str]:
        """``HAS_Org`` targets of an article (see the module function)."""
        return organization_links(orgs)

    def _encode_rows(self, texts: Sequence[str]) -> Vectors:
        vectors = np.asarray(self._encode(texts), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ValueError(
                f"encode returned shape {vectors.shape} for {len(texts)} texts; "
                "expected one row per text"
            )
        return vectors

    def _match(self, phrases: Sequence[str], vectors: Vectors) -> list[EntityLink]:
        """Each keyphrase goes to its most similar attribute's entity if similar enough;
        each entity keeps its best keyphrase."""
        if not phrases:
            return []
        self.warm_up()
        assert self._attr_vectors is not None
        sims = vectors @ self._attr_vectors.T  # phrases x attributes
        best_attr = sims.argmax(axis=1)
        best_score = sims[np.arange(len(phrases)), best_attr]
        best: dict[int, tuple[float, int]] = {}
        for index, phrase in enumerate(phrases):
            # Unit vectors in float32 can give 1.0000001 for identical texts.
            score = min(float(best_score[index]), 1.0)
            needed = self.single_word_threshold if len(phrase.split()) == 1 else self.threshold
            if score < needed:
                continue
            entity = int(self._attr_owner[best_attr[index]])
            if entity not in best or score > best[entity][0]:
                best[entity] = (score, index)
        links = [
            EntityLink(entity_id=self._entity_ids[entity], keyphrase=phrases[index], score=score)
            for entity, (score, index) in best.items()
        ]
        links.sort(key=lambda link: (-link.score, link.entity_id))
        return links
