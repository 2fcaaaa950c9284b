"""Text utilities of the generator: sentence splitting, tokens, answer normalization.

The splitter is rule-based on purpose: it runs on every answer and every
source, needs no model data, and only has to be right on news prose, where
the usual traps are abbreviations ("U.S.", "Dec. 1"), initials, decimals and
the trailing ellipses of search snippets.
"""

from __future__ import annotations

import bisect
import re
import string
import unicodedata
from collections.abc import Iterable

from attest.generate.stems import same_word, stem


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words that end with a period without ending a sentence.
_ABBREVIATIONS = _words(
    """
    mr mrs ms dr prof sr jr st mt ft vs etc inc ltd co corp dept univ gov gen col lt sgt
    capt cmdr adm rep sen jan feb mar apr jun jul aug sep sept oct nov dec no vol fig
    approx est e.g i.e u.s u.k u.n e.u a.m p.m d.c
    """
)
# A candidate boundary: sentence punctuation, optional closing quotes or
# brackets, then whitespace.
_BOUNDARY = re.compile(r"""([.!?…]+["'”’)\]]*)\s+""")
# A word: letters and digits with apostrophes, periods or hyphens inside ("U.S.", "co-founder").
WORD = re.compile(r"[\w][\w'’.-]*[\w]|[\w]", re.UNICODE)
_SPACE = re.compile(r"\s+")

# Common English function words: they carry no evidence that a source supports
# a sentence, so token overlap ignores them.
STOPWORDS = _words(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves also says said say one new may might must shall us yes
    """
)


def clean(text: str) -> str:
    """Unicode-normalized text with runs of whitespace made single spaces."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def _ends_with_abbreviation(chunk: str) -> bool:
    words = chunk.rstrip().split()
    if not words:
        return False
    last = words[-1].rstrip(".\"'”’)]").lower()
    if last in _ABBREVIATIONS:
        return True
    # Initials ("J." in "J. K. Rowling") and dotted acronyms ("U.S.").
    return (len(last) == 1 and last.isalpha()) or bool(re.fullmatch(r"(?:\w\.)+\w", last))


# A blank line, or a line break before a list item ("- ", "* ", "• ", "2. ",
# "b) "): where a heading, a paragraph or an item ends, whatever its last mark.
_BLOCK_BREAK = re.compile(r"\n[ \t]*\n\s*|\n(?=[ \t]*(?:[-*•‣▪]|\d{1,3}[.)]|[a-z][)])[ \t]+\S)")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` in order; never empty pieces. A heading, a list item
    or a paragraph without a final stop is a sentence of its own."""
    return [s for block in _BLOCK_BREAK.split(text) for s in _block_sentences(block)]


def _block_sentences(text: str) -> list[str]:
    text = clean(text)
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end(1)
        following = text[match.end() : match.end() + 1]
        candidate = text[start:end]
        punctuation = match.group(1)
        # A lower-case or numeric continuation means the period was not final
        # ("Dec. 1", "approx. two"), unless it was a real ! or ?.
        period = "." in punctuation and "…" not in punctuation and "..." not in punctuation
        not_final = _ends_with_abbreviation(candidate) or bool(
            following and not following.isupper()
        )
        if period and not_final and not (following and following in "\"'“‘(["):
            continue
        sentences.append(candidate.strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if any(ch.isalnum() for ch in s)]


def tokens(text: str) -> list[str]:
    """Lower-case word tokens, punctuation stripped."""
    return [t.strip(".-'’").lower() for t in WORD.findall(unicodedata.normalize("NFKC", text))]


def content_tokens(text: str) -> set[str]:
    """Tokens that carry meaning: no stopwords, no one-letter tokens."""
    return {t for t in tokens(text) if t and t not in STOPWORDS and (len(t) > 1 or t.isdigit())}


_PUNCT = str.maketrans({c: " " for c in string.punctuation + "“”‘’–—…"})


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style)."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCT)
    words = [w for w in text.split() if w not in ("a", "an", "the")]
    return " ".join(words)


def contains_answer(text: str, answer: str) -> bool:
    """True when the normalized ``answer`` appears in ``text`` on word boundaries."""
    needle = normalize_answer(answer)
    if not needle:
        return False
    return f" {needle} " in f" {normalize_answer(text)} "


def key_terms(text: str) -> set[str]:
    """The facts a sentence states: capitalized words (names, places, months) and
    tokens with digits (years, amounts, scores), lower-cased, stopwords removed.

    A citation has to support these; generic words say little about whether a
    source backs a claim.
    """
    out = set()
    for match in WORD.finditer(unicodedata.normalize("NFKC", text)):
        word = match.group()
        if word[0].isupper() or any(ch.isdigit() for ch in word):
            token = word.strip(".-'’").lower()
            if token and token not in STOPWORDS:
                out.add(token)
    return out


_NUMBER_HINTS = _words(
    """
    revenue revenues price cost sales profit income population number amount salary budget
    valuation value worth score
    """
)


# Words after "what" that make it ask about something other than a named thing
# ("what is ...", "what happened ...").
_VERBS_AFTER_WHAT = _words(
    """
    is was are were be been do does did has have had will would can could should shall
    may might must happened happens happen caused causes made makes if about kind sort type
    """
)


# "What drove / caused / led to X?" asks for a cause, as "why" does, whatever
# X names: "what drove the fall in sales" asks for no amount. Only the forms
# a verb takes right after "what": "what cause of death", "what drive
# capacity" are nouns.
_CAUSE_VERBS = _words(
    """
    drove drives caused causes led leads explains explained
    contributed contributes prompted prompts triggered triggers motivated motivates
    """
)
# After a plural noun ("what drives are in the NAS", "what causes does the
# foundation support"), not after the verb of a cause.
_AUXILIARIES = _words("is are was were do does did have has had can could will would")


def _asks_cause(question: str, words: list[str]) -> bool:
    """Whether a "what" question is led by a verb of cause ("What drove ...")."""
    if words[0] != "what" or len(words) < 2 or words[1] not in _CAUSE_VERBS:
        return False
    if words[1].endswith("s") and words[2:3] and words[2] in _AUXILIARIES:
        return False  # "What causes are ...": a noun
    # "What LED bulbs ...": an acronym, not the verb.
    written = WORD.findall(unicodedata.normalize("NFKC", question))
    return not (len(written) > 1 and written[1].isupper())


_WH_WORDS = _words("what which who whom whose when where why how")
# A question with no wh-word that asks for a place ("... location", "... venue").
_PLACE_WORDS = _words("location venue place city country host")


# A lead-in phrase before the question proper starts with a preposition or a
# participle: "As of May 26, 2023, what ...", "Using only the balance sheet,
# how much ...", "During the siege, which commander ...". A clause before it
# ("Marion Greene worked for a company, which had how many ...") is no lead-in.
_LEAD_IN_STARTS = _words(
    "about according across after among as at based before between by considering "
    "during excluding following for from given in including looking on over per "
    "regarding since through throughout under until using with within without"
)
_LEAD_IN_END = re.compile(
    r",\s+(?=(?:by\s+how|who|whom|whose|what|which|when|where|why|how)\b)", re.IGNORECASE
)


def question_proper(question: str) -> str:
    """``question`` without a lead-in phrase (``_LEAD_IN_STARTS``): what is
    asked starts at the wh-word after its comma. "As of May 26, 2023, what is
    the total amount PepsiCo may borrow?" asks "what is the total amount
    PepsiCo may borrow?" (as of that date). White space is collapsed; a
    question without a lead-in is returned as it is. A phrase with a wh-word
    in its first words is the question ("In which year did the company,
    which makes widgets, go public?", "For how many years did ..."): a comma
    in it ends a clause, not a lead-in."""
    text = " ".join(question.split())
    words = tokens(text[:40])
    if not words or words[0] not in _LEAD_IN_STARTS:
        return text
    end = _LEAD_IN_END.search(text)
    if end is None or _WH_WORDS & set(tokens(text[: end.start()])[1:3]):
        return text
    return text[end.end() :]


def answer_type(question: str) -> str:
    """The kind of fact a question asks for: "date", "number", "name" or "" (any).

    Classic wh-word typing: when, and what/which asking for a date ("what
    year ...", "what is the release date of ...") → a date; how many/much and
    questions about an amount → a number; who/whom/whose, which/what + noun,
    "what is the name of" and a question without a wh-word that asks for a
    place ("... location") → a name; "what drove/caused ..." asks for a cause
    (any). A lead-in phrase is read past (``question_proper``); a question
    worded as a statement is typed by the wh-phrase inside it
    (``_asked_in_place``).
    """
    question = question_proper(question)
    words = tokens(question)
    if not words:
        return ""
    head = words[:2]
    if (
        "when" in words[:3]
        or ("what" in head and ({"year", "date", "day"} & set(words[1:3])))
        or (words[0] in ("what", "which") and {"date", "dates"} & set(words))
        # "In which year ...", "On what date ...", "Since what year ..."
        or (
            words[0] in ("in", "on", "since", "until", "by")
            and words[1:2] in (["which"], ["what"])
            and words[2:3] in (["year"], ["date"], ["day"], ["month"])
        )
    ):
        return "date"
    if _asks_cause(question, words):
        return ""  # a cause
    if ("how" in head and ({"many", "much", "long", "old"} & set(words[1:3]))) or (
        words[0] == "what" and _NUMBER_HINTS & set(words)
    ):
        return "number"
    if words[0] in ("who", "whom", "whose", "which", "where"):
        return "name"
    if words[0] == "what" and "name" in words[1:4]:
        return "name"  # "what is the name of ..."
    if words[0] not in _WH_WORDS and _PLACE_WORDS & set(words):
        return "name"  # "Super Bowl 2021 location"
    if words[0] == "what" and len(words) > 1 and words[1] not in _VERBS_AFTER_WHAT:
        return "name"  # "what company ...", "what movie ..."
    if (
        question.rstrip().endswith("?")
        and words[0] not in _WH_WORDS
        and words[0] not in ("in", "on", "since", "until", "by")
    ):
        # After an auxiliary ("Was the tower built in what year?") only a date
        # or number phrase asks: a "which"/"who" there is most often relative
        # ("Did the company which acquired Slack report a profit?").
        return _asked_in_place(words, names=words[0] not in _QUESTION_STARTS)
    return ""


# The words after "who" or "whom" that leave it asking ("... hosted by whom on
# Workaholics?"), where a verb makes it a relative pronoun ("an actor who
# achieved ...").
_AFTER_ASKING_WHO = _words("on in at for from during of with about before after")
_DATE_NOUNS = _words("year years date day month")
_AMOUNT_AFTER_HOW = _words("many much long old far")
# "... reported what amount of revenue?", "... what percentage of sales?"
_AMOUNT_NOUNS = _words("amount percentage percent share proportion rate total")


def _asked_in_place(words: list[str], names: bool = True) -> str:
    """The kind of fact a wh-phrase inside a question worded as a statement
    asks for (one that ends with a question mark): "VCU, which was founded
    in what year?" a date, "The arena can seat how many people?"
    a number ("... reported what amount of revenue?" too), "... directed by
    who?" and "... voiced what hedgehog?" a name. A date or number phrase
    anywhere decides first; "which" or "what" before an auxiliary ("a company
    which was founded") and "who" before any word but a preposition ("an
    actor who achieved") are relative pronouns that ask nothing. In a
    question that opens with an auxiliary only a date or number phrase asks
    (``names`` off: "Was the Eiffel Tower built in what year?" a date, "Did
    the company which acquired Slack report a profit?" nothing)."""
    pairs = list(zip(words, [*words[1:], ""], strict=True))
    if any(w in ("what", "which") and after in _DATE_NOUNS for w, after in pairs):
        return "date"
    if any(w == "how" and after in _AMOUNT_AFTER_HOW for w, after in pairs) or any(
        w == "what" and after in _NUMBER_HINTS | _AMOUNT_NOUNS for w, after in pairs
    ):
        return "number"
    for w, after in pairs[1:] if names else ():
        if w in ("who", "whom") and (not after or after in _AFTER_ASKING_WHO):
            return "name"
        if w == "what" and after in _CAUSE_VERBS:
            return ""  # "... said what drove the decline?": a cause
        if w in ("what", "which") and after and after not in _VERBS_AFTER_WHAT:
            return "name"
    return ""


_WHAT_BE = re.compile(r"^what\s+(?:is|was|are|were)\s+(?P<rest>.+?)[\s?.!]*$", re.I)
_WHO_BE = re.compile(r"^(?:who|whom)\s+(?:is|was|are|were)\s+(?P<rest>.+?)[\s?.!]*$", re.I)
# "Apple's", "Beatles'" (not "O'Brien").
_POSSESSIVE = re.compile(r"\w['’](?:s\b|(?=\s))")
# The longest question whose phrase a refusal repeats.
_PHRASE_MAX = 200


def asked_phrase(question: str) -> tuple[str, str]:
    """What a question asks for, as a noun phrase and the verb that goes with
    it, for saying that no source gives it: "What were Fennick Retail Group's
    scope 1 emissions in 2025?" asks for ("states", "Fennick Retail Group's
    scope 1 emissions in 2025"), "Who is the CEO of Nintendo?" for ("names",
    "the CEO of Nintendo"). ("", "") for a question of any other form (its
    wh-word would have to be turned into a clause) and for one whose phrase
    is only a pronoun ("What is it?").

    Only a phrase that reads as the thing asked for is given: one that starts
    with "the" or has a possessive ("Apple's revenue", "the Beatles' albums"),
    so not "Who is Tim Cook?" or "What is a black hole?" (they ask what it
    is, not for it); none that ends in a preposition ("married to") or asks
    what something is like; none of a question that asks for several things
    or of one over ``_PHRASE_MAX`` characters, which is not echoed back."""
    text = " ".join(question.split())
    if len(text) > _PHRASE_MAX or is_compound(text):
        return "", ""
    for pattern, verb in ((_WHAT_BE, "states"), (_WHO_BE, "names")):
        match = pattern.match(text)
        if match is None:
            continue
        rest = match.group("rest")
        words = tokens(rest)
        # A choice ("What is larger, a or b?") asks for one of its options.
        if not words or all(w in STOPWORDS for w in words) or re.search(r",.*\bor\b", rest):
            return "", ""
        if "?" in rest or words[-1] in STOPWORDS or "like" in words:
            return "", ""
        if not (rest.startswith("the ") or _POSSESSIVE.search(rest)):
            return "", ""
        return verb, rest
    return "", ""


def lower_case_words(texts: Iterable[str]) -> frozenset[str]:
    """Words written in lower case somewhere in ``texts``.

    A proper name is capitalized wherever it appears, so a capitalized word
    that the same texts also write in lower case ("Winners", "Year" in a
    heading) is an ordinary word, not a name.
    """
    return frozenset(
        w.strip(".-'’")
        for text in texts
        for w in WORD.findall(unicodedata.normalize("NFKC", text))
        if w[0].islower()
    )


# A name's initial: one capital letter, or several dotted ("C", "J.K"), as
# ``WORD`` reads them.
_INITIAL = re.compile(r"(?:[A-Z]\.)*[A-Z]")
# What follows an initial inside a name: its full stop, then on the same line
# one capitalized word that ends the name (punctuation, a lower-case word or
# the end after it): "John C. Bogle spoke", not "Plan B. Jan Novak resigned".
_AFTER_INITIAL = re.compile(r"\.[ \t]+[A-Z][\w'’-]*(?![\w'’-])(?=[ \t]*(?:$|\n|[^\w\s]|[a-z]))")


def initial_at(text: str, match: re.Match[str]) -> bool:
    """Whether the ``WORD`` match is an initial inside a name, its full stop
    no sentence end ("C." in "John C. Bogle", "J.K." in "J.K. Rowling")."""
    return bool(_INITIAL.fullmatch(match.group())) and bool(_AFTER_INITIAL.match(text, match.end()))


def ordinary_words(texts: Iterable[str]) -> frozenset[str]:
    """Words of ``texts`` that are not names: those written in lower case
    somewhere (``lower_case_words``) and, lower-cased, those capitalized only
    where a sentence starts ("Results of the election ...", "Two winners
    were named"; an initial's full stop starts none: "John C. Bogle") or only
    in headings (``heading_spans``: "Round by Round
    Wimbledon Bracket", "Maxwell Award Winners"): a name is capitalized inside
    running text too."""
    texts = [unicodedata.normalize("NFKC", t) for t in texts]
    initial: set[str] = set()
    inside: set[str] = set()
    headed: set[str] = set()
    for text in texts:
        headings = heading_spans(text)
        # The headings' starts, in order (they do not overlap): each word is
        # looked up by bisection, not against every heading.
        starts_at = [a for a, _ in headings]
        end = -1
        previous = ""  # a capitalized word that started a sentence, just before
        after_initial = False  # the full stop before this word is an initial's
        for match in WORD.finditer(text):
            word = match.group().strip(".-'’")
            gap = text[end : match.start()] if end >= 0 else "."
            if after_initial:
                gap = gap.replace(".", "", 1)
            end = match.end()
            after_initial = initial_at(text, match)
            if not word or not word[0].isupper():
                previous = ""
                continue
            k = bisect.bisect_right(starts_at, match.start()) - 1
            if k >= 0 and match.start() < headings[k][1]:
                headed.add(word.lower())
                previous = ""
                continue
            starts = any(ch in gap for ch in ".!?…")
            if not starts and previous and not gap.strip():
                # A run of capitalized words that starts a sentence is a name
                # ("Brightwater Utilities cut ..."), its first word included.
                inside.add(previous)
            (initial if starts else inside).add(word.lower())
            previous = word.lower() if starts and word.lower() not in STOPWORDS else ""
    return lower_case_words(texts) | frozenset((initial | headed) - inside)


# A piece of text between sentence ends, colons, semicolons, bullets and bars.
_SEGMENT = re.compile(r"[^.!?…:;·|•\n]+")
# Content words a heading has at least.
_HEADING_WORDS = 3


def heading_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` has a heading: a piece of it (``_SEGMENT``) of at least
    ``_HEADING_WORDS`` content words, every one of them capitalized ("Round by
    Round Wimbledon Bracket", "2017 Walter Camp Award Semifinalist"). Running
    text has lower-case words between its names ("The film stars James
    Franco, Michelle Williams and Mila Kunis"), and a piece with a comma is a
    list of names, not a heading ("Cast: James Franco, Michelle Williams").
    The full stop of an abbreviation ends no piece: "Dr. Martin Luther King
    Jr. spoke" is one piece, with the lower-case words of running text."""
    pieces: list[tuple[int, int]] = []
    start: int | None = None
    for piece in _SEGMENT.finditer(text):
        if start is None:
            start = piece.start()
        end = piece.end()
        if text[end : end + 1] == "." and _ends_with_abbreviation(text[piece.start() : end + 1]):
            continue  # "Dr." "Jr.": the piece goes on after the stop
        pieces.append((start, end))
        start = None
    if start is not None:
        pieces.append((start, len(text)))
    out = []
    for begin, end in pieces:
        span = text[begin:end]
        if "," in span:
            continue
        words = [w for w in WORD.findall(span) if w[0].isalpha() and w.lower() not in STOPWORDS]
        if len(words) >= _HEADING_WORDS and all(w[0].isupper() for w in words):
            out.append((begin, end))
    return out


# A sentence that only sends the reader elsewhere: "For additional
# information regarding costs, refer to Note 1", "See Item 7 for a
# discussion", "Please refer to page 12". Reports, filings and encyclopedias
# write their cross-references this way; such a sentence states nothing.
_POINTER = re.compile(
    r"^\W*(?:for\s+(?:additional|further|more)(?:\s+detailed)?\s+"
    r"(?:information|discussion|details?|detail)\b[^.;]*?\b(?:see|refer|refers|read)\b"
    r"|(?:please\s+)?(?:see|refer\s+to|refer\s+also\s+to|see\s+also)\s)",
    re.IGNORECASE,
)


# What a cross-reference names and may number ("Note 1", "Items 7 and 7A",
# "pages 12-14", "Exhibit 10.1", "Form 10-K"), and a year ("fiscal 2023"):
# the numbers a pointer carries without stating a figure.
_DESIGNATOR = r"(?:\d+(?:[.\-\u2013]?[a-z0-9]+)*|[ivxlc]+[a-z]?\b)"
_REFERENCE = re.compile(
    r"\b(?:notes?|items?|parts?|sections?|pages?|pp?\.|exhibits?|schedules?|tables?"
    r"|appendix|appendices|annex(?:es)?|chapters?|figures?|fig\.|articles?|forms?)"
    rf"\s+{_DESIGNATOR}(?:\s*(?:,|and|or|to|through|-|\u2013)\s*{_DESIGNATOR})*\b"
    r"|\b(?:19|20)\d\d\b",
    re.IGNORECASE,
)


def refers_elsewhere(text: str) -> bool:
    """Whether a sentence only points to another part of the document
    ("For more information, see Note 4.", "Refer to Item 7."): an answer
    cannot be taken from it. One that gives a figure besides what it points
    to states it ("Refer to the table: emissions fell 30%", "See how revenue
    grew 20% to $3 billion"), whatever its first words."""
    return bool(_POINTER.match(text)) and not any(ch.isdigit() for ch in _REFERENCE.sub(" ", text))


def stated_text(text: str) -> str:
    """``text`` without its sentences that only refer the reader elsewhere
    (``refers_elsewhere``); ``text`` itself when it has none. The sentences
    kept stay sentences of their own (a blank line between them): a heading
    or a list item without a final stop is not run into the next sentence."""
    sentences = split_sentences(text)
    kept = [s for s in sentences if not refers_elsewhere(s)]
    return text if len(kept) == len(sentences) else "\n\n".join(kept)


_MONTH_RE = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
# A leading dateline: "Jul 22, 2020 ...", "22 July 2020 -", "LONDON, May 5 (Reuters) -".
_DATELINE = re.compile(
    rf"^\s*(?:[A-Z][A-Za-z .]{{1,30}},\s*)?"
    rf"(?:{_MONTH_RE}\s+\d{{1,2}}(?:,?\s+\d{{4}})?|\d{{1,2}}\s+{_MONTH_RE}(?:,?\s+\d{{4}})?)"
    rf"\s*(?:\([^)]{{1,40}}\))?\s*(?:\.\.\.|…|-|–|—|:|\|)\s*"
)


def strip_dateline(text: str) -> str:
    """``text`` without a leading dateline: when a piece was published is not a
    fact it states, so it must not count as a date (or number) in answers."""
    return _DATELINE.sub("", text, count=1)


_YEAR = re.compile(r"\b(1[5-9]\d\d|20\d\d)\b")


def dateline_year(text: str) -> str:
    """The year of ``text``'s leading dateline ("Oct 7, 2021 ..."), or ""."""
    match = _DATELINE.match(text)
    years = _YEAR.findall(match.group()) if match else []
    return years[0] if years else ""


# A word and the number that tells which one ("season 4", "Q1", "PS5", "92nd").
_LABELLED = re.compile(r"\b([A-Za-z]{1,12})[ -]?(\d{1,3})(?:st|nd|rd|th)?\b")
_ORDINAL = re.compile(r"\b(\d{1,3})(?:st|nd|rd|th)\s+([A-Za-z]{3,})")


def numbered_labels(text: str) -> dict[str, set[str]]:
    """Words and the numbers that tell which one: "season 4" → {"season": {"4"}}."""
    out: dict[str, set[str]] = {}
    for word, number in _LABELLED.findall(text):
        if word.lower() not in STOPWORDS:
            out.setdefault(word.lower(), set()).add(number)
    for number, word in _ORDINAL.findall(text):
        out.setdefault(word.lower(), set()).add(number)
    return out


# A name and the common noun after it: "Cobb Fell wind farm", "Calder Flats
# data centre" (one or two lower-case words, then a word boundary). A name
# starts a word: begun inside one, a long run of letters would be scanned
# again from each of its capitals.
_NAMED_THING = re.compile(
    r"(?<![\w-])((?:[A-Z][\w-]*\s+){0,3}[A-Z][\w-]*)(?:['’]s)?\s+"
    r"([a-z]{3,}(?:\s+[a-z]{3,})?)\b"
)
# Words of a time after a name ("Kansas City last year"): when, not a kind of thing.
_WHEN_WORDS = _words(
    """
    last next past previous earlier later ago today tonight yesterday tomorrow
    day days night nights week weeks weekend month months year years season seasons
    """
)


def _folded(word: str) -> str:
    """``word`` lower-cased without accents: "Malmö" and "Malmo" are one name."""
    decomposed = unicodedata.normalize("NFKD", word.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _after_first_word(text: str) -> str:
    parts = text.split(None, 1)
    return parts[1] if len(parts) > 1 else ""


def _named_things(text: str) -> dict[str, set[str]]:
    """Per common noun phrase after a name ("wind farm"), the name words
    before it, lower-cased without accents. A noun phrase whose second word
    is a stopword is kept by its first word alone; "wind farm" and "wind
    farms" are different phrases."""
    out: dict[str, set[str]] = {}
    for name, noun in _NAMED_THING.findall(text):
        words = noun.split()
        if words[0] in STOPWORDS or _WHEN_WORDS.intersection(words):
            continue
        if len(words) > 1 and words[1] in STOPWORDS:
            words = words[:1]
        names = {_folded(w) for w in name.split()} - STOPWORDS
        if names:
            out.setdefault(" ".join(words), set()).update(names)
    return out


def names_another(sentence: str, question: str) -> bool:
    """True when the sentence names another one of a thing the question names
    by a name: the question asks about the "Cobb Fell wind farm" and the
    sentence is about the "Brannock Moor wind farm" without naming Cobb Fell.
    A first word of the question or of the sentence is not taken as a name
    ("Meanwhile total revenue rose"), nor is a dateline part of the sentence
    ("COBB FELL, Oct. 9, 2025 — The Brannock Moor wind farm ...")."""
    wanted = {
        noun: names
        for noun, names in _named_things(_after_first_word(question)).items()
        if len(noun.split()) == 2  # "wind farm", "data centre": a kind of thing
    }
    if not wanted:
        return False
    body = strip_dateline(sentence)
    have = _named_things(_after_first_word(body))
    words = {_folded(t.strip(".-'’")) for t in WORD.findall(body)}
    return any(
        noun in have and not names & have[noun] and not names <= words
        for noun, names in wanted.items()
    )


# "Which wind farm supplies ...", "What data centre ...": a name of a kind asked for.
_WHICH_KIND = re.compile(r"^(?:which|what)\s+([a-z]{3,}\s+[a-z]{3,})\s+\w", re.IGNORECASE)


def asked_kind(question: str) -> str:
    """The kind of thing a "which/what <kind> ..." question asks the name of,
    when the kind is two words ("wind farm", "data centre", "stock exchange"):
    its answer names one ("the Brannock Moor wind farm"). "" otherwise: a
    one-word kind ("which country") is as often answered without the word
    ("Norway topped the table") as with it. A verb read as part of the kind
    ("which country won") names nothing in the sources, so the ranking that
    prefers sentences naming the kind (``extractive``) leaves them as they are."""
    text = question_proper(question)
    match = _WHICH_KIND.match(text)
    # A choice ("Which board game was published first, Pirate's Cove or
    # Catan?") is answered by one of its options, not by any named one.
    if match is None or re.search(r"\bor\b", text[text.find(",") :] if "," in text else ""):
        return ""
    kind = match.group(1).lower()
    if any(w in STOPWORDS or w in _VERBS_AFTER_WHAT for w in kind.split()):
        return ""
    return kind


def names_kind(sentence: str, kind: str) -> bool:
    """Whether ``sentence`` names one of ``kind`` ("Brannock Moor wind farm")."""
    have = _named_things(strip_dateline(sentence))
    return any(noun == kind or noun.rstrip("s") == kind for noun in have)


# "Who became the independent chair of ...": the role a person is asked for.
_WHO_ROLE = re.compile(
    r"^who\s+(?:is|was|are|were|became|becomes|has\s+become|will\s+become)\s+"
    r"(?:the\s+)?(?:(?:new|current|former|next|first|last)\s+)?"
    r"(?P<role>[a-z]{3,}\s+[a-z]{3,})\s+(?:of|at|for|in)\b"
)


def asked_role(question: str) -> str:
    """The role a "who is/became the <role> of ..." question asks the holder
    of, when it is two lower-case words ("independent chair", "chief
    executive"): a sentence that names its holder says the role ("Rosalind
    Achebe-Fry was named independent chair"). "" otherwise: a one-word role
    ("director", "winner") is as often said by a verb ("directed", "won")."""
    text = question_proper(question)
    match = _WHO_ROLE.match(text[:1].lower() + text[1:])
    if match is None:
        return ""
    role = match.group("role")
    return "" if any(w in STOPWORDS for w in role.split()) else role


# "Who is the CEO of ...", "Who was the runner-up of ...", "Who is the Maxwell
# Award winner in ...": the role, of one to four words, before its "of".
_WHO_HOLDS = re.compile(
    r"^who(?:['’]s|\s+(?:is|was|are|were|became|becomes|has\s+become|will\s+become))\s+"
    r"(?:the\s+)?(?P<role>[\w'’-]+(?:\s+[\w'’-]+){0,3}?)\s+(?:of|at|for|in)\s",
    re.IGNORECASE,
)


def role_head(question: str) -> str:
    """The last word of the role a "who is/was/became the <role> of ..."
    question asks the holder of, lower-cased: "ceo" for "Who is the CEO of
    Google?", "actress" for "Who is the lead actress in ...?". "" when the
    question is not of that form. Unlike ``asked_role`` a one-word role
    counts: it is only used to tell the role's organisation ("CEO of Google
    and Alphabet") from its holder, not to require the role be said."""
    match = _WHO_HOLDS.match(question_proper(unicodedata.normalize("NFKC", question)))
    if match is None:
        return ""
    head = match.group("role").split()[-1].lower()
    return "" if head in STOPWORDS or not any(ch.isalpha() for ch in head) else head


def says_role(sentence: str, role: str) -> bool:
    """Whether ``sentence`` says ``role``: its words, in order and adjacent,
    each of the same word family ("independent chair", "Independent chair")."""
    want = [stem(w) for w in role.split()]
    have = [stem(t) for t in tokens(strip_dateline(sentence))]
    n = len(want)
    return any(
        all(same_word(h, w) for h, w in zip(have[i : i + n], want, strict=True))
        for i in range(len(have) - n + 1)
    )


def names_holder(sentence: str, question: str) -> bool:
    """Whether ``sentence`` says the role ``question`` asks the holder of
    (``asked_role``) and names someone the question does not: "Rosalind
    Achebe-Fry, a former deputy governor, was named independent chair" for
    "Who became the independent chair of Marrowgate Bank?". Such a sentence
    answers the question whichever source states it, so the judges rate it
    by its support alone."""
    role = asked_role(question)
    if not role or not says_role(sentence, role):
        return False
    asked = {_folded(w) for w in tokens(question)}
    body = _after_first_word(strip_dateline(sentence))
    return any(
        w[0].isupper() and any(ch.isalpha() for ch in w) and _folded(w.strip(".-'’")) not in asked
        for w in WORD.findall(body)
        if w.lower() not in STOPWORDS
    )


def conflicts_with_question(sentence: str, question: str, published: str = "") -> bool:
    """True when the sentence is about another one of what the question names.

    * Another year: the question names a year and the sentence names only
      other years ("Revenue in Q1 2021" is not answered by a sentence about
      2022). A news sentence is also about the year it was published
      (``published``, its source's dateline year): "had held both posts
      since 2019" in a 2025 piece is about 2025 too, and one that names no
      year at all is about the year it appeared.
    * Another number of the same thing: "season 4" is not answered by a
      sentence about "season 3" only, nor "Q1" by one about "Q2".
    * Another name for the same kind of thing (``names_another``): the
      "Brannock Moor wind farm" for a question about the "Cobb Fell wind farm".
    """
    if names_another(sentence, question):
        return True
    asked = set(_YEAR.findall(question))
    body = strip_dateline(sentence)
    stated = set(_YEAR.findall(body)) | ({published} if published else set())
    if asked and stated and not stated & asked:
        return True
    wanted = numbered_labels(re.sub(_YEAR, " ", question))
    if not wanted:
        return False
    have = numbered_labels(re.sub(_YEAR, " ", body))
    return any(word in have and not have[word] & numbers for word, numbers in wanted.items())


_COMPOUND = re.compile(
    r"(?:,|\band)\s+(?:(?:and|or)\s+)?(?:who|whom|whose|what|which|when|where|why|how)\b"
    r"|\band\s+for\s+what\b",
    re.IGNORECASE,
)


def is_compound(question: str) -> bool:
    """True when the question asks for several things ("how much ..., and which ...");
    a lead-in phrase's comma before the wh-word ("As of May 26, 2023, what is
    ...") is not a second question (``question_proper``)."""
    return bool(_COMPOUND.search(question_proper(question)))


# The words a question of its own starts with.
_QUESTION_STARTS = _WH_WORDS | _words(
    "is was are were do does did has have had can could will would should which"
)


def compound_parts(question: str) -> list[str]:
    """The questions a compound question asks, in order: "How many ships did
    Orrin Bay order, and how many does it now plan to take?" asks "How many
    ships did Orrin Bay order?" and "how many does it now plan to take?".
    A question asking one thing (or one over ``_PHRASE_MAX`` characters) is
    its only part."""
    text = " ".join(question.split())
    if len(text) > _PHRASE_MAX:
        return [text]
    parts: list[str] = []
    start = 0
    for match in _COMPOUND.finditer(text):
        # The next part starts at its wh-word (or at "for what").
        word = re.search(r"(?:for\s+)?\w+$", match.group())
        assert word is not None
        head = text[start : match.start()].strip(" ,;")
        if head:
            parts.append(head.rstrip("?") + "?")
        start = match.start() + word.start()
    tail = text[start:].strip(" ,;")
    if tail:
        parts.append(tail.rstrip("?") + "?")
    # Each part a question of its own, joined by "and"/"or": not a clause
    # ("During the siege, which commander ...", "the university whose main
    # campus is in Lawrence, Kansas and whose branch campuses ...").
    joined = [m.group() for m in _COMPOUND.finditer(text)]
    if (
        len(parts) < 2
        or tokens(parts[0])[:1] == []
        or tokens(parts[0])[0] not in _QUESTION_STARTS
        or any(not re.search(r"\b(?:and|or)\b", j, re.IGNORECASE) for j in joined)
        or any(tokens(part)[:1] == ["whose"] for part in parts[1:])
    ):
        return [text]
    return parts
