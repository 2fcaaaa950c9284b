"""What a question about an amount measures, and whether a sentence gives an amount of it.

"How many turbines does the Cobb Fell wind farm have?" is answered by a
sentence that counts turbines ("its 48 turbines"), not by one that mentions
turbines and another number ("switch off turbines for up to two hours");
"What revenue did Orrin Bay report?" is not answered by Orrin Bay's scope 1
emissions, however close to the question that sentence reads, nor by "the
report broke down revenue by country" with no amount of revenue in it.
Both are the commonest way a fluent extractive answer goes wrong on
questions about figures, and the features and the reader rate such
sentences highly: they name the company, the year and a number.

So a question about an amount names the *measure* it asks for (the noun
counted or measured: "turbines", "revenue", "scope 1 emissions"), and a
sentence answers it only when it gives an amount of that measure: a word of
the measure's family (``same_word``) with an amount within a few words of
it (digits other than a year, or a number word other than the "one" of
"one of the ..."; "people" is of the family of "person"), and the numbered labels
the measure carries ("scope 1", "Q3") when it carries any.

The measure is read from the question's form, and only where the form is
unambiguous (``asked_measure``):

* "how many <noun> ..." and "how much <noun> ..." ask for an amount by
  their form; the counted noun is the last plural of the words after
  "many" (the first word after "much"); "how much did <subject> <verb>
  its/their/the <noun>" measures the noun ("cut its emissions");
* "what <measure> did ..." asks for an amount when the question types as
  a number (``answer_type``: "revenue", "price", ...), not otherwise ("what
  type of structure does ...", "what film did ...");
* "what was/were/is/are <owner>'s <measure> [in/for ...]" and "what
  was/were/is/are the <measure> of <owner>" ask for an amount when the
  question types as a number or, when it types as nothing, when the
  sources themselves write the measure with amounts (``measured_in``):
  "scope 1 emissions of 4.7 million tonnes" makes emissions a measure,
  nothing makes "nationality" one.

A question asking for a date, a name, a rank ("year-end No 1") or a kind
("what type of ..."), one asking for a generic amount that its unit states
("how much money", "how many times", "how many percentage points", "how
much did Google pay") and one over 400 characters name no measure: the
check does not apply to them. A question asking several things names one
only when every part asks for an amount of the same one ("How many ships did
it order, and how many does it now plan to take?").
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from attest.generate.stems import same_word, stem
from attest.generate.text import (
    STOPWORDS,
    answer_type,
    compound_parts,
    is_compound,
    numbered_labels,
    question_proper,
    strip_dateline,
)


def _set(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words a sentence may put between an amount and its measure, either side:
# "48 onshore wind turbines", "scope 1 emissions of 4.7 million tonnes".
_BEFORE = 5
_AFTER = 6
_NUMBER_WORDS = _set(
    """
    zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety
    hundred hundreds thousand thousands million millions billion billions trillion dozen
    dozens
    """
)
# Amounts whose unit is the answer itself ("$5 million" is "how much money"),
# and comparatives before the counted noun ("how many more titles").
_GENERIC = _set("money cash time times long far often old")
_SKIP = _set("more fewer less additional extra other different separate")
_AUX = _set("did does do was were is are has have had will would can could should may might must")
# The most words a measure's phrase has ("combined scope 1 and scope 2
# emissions" has 7); a longer run is not a noun phrase read right.
_LONGEST = 8
# Longer questions are not read for a measure (a paste, not a question).
_LONGEST_QUESTION = 400
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")
_YEAR = re.compile(r"(?:1[5-9]|20)\d\d")

_WHAT_BE = re.compile(
    r"^what\s+(?:is|was|are|were|will\s+be)\s+(?P<rest>.+?)[\s?.!]*$", re.IGNORECASE
)
_WHAT_NOUN = re.compile(
    r"^what\s+(?P<np>[^\W\d_]+(?:[\s-][^\W\d_]+){0,2})\s+(?:did|does|do|has|have|had|will)\b",
    re.IGNORECASE,
)
_HOW = re.compile(r"^how\s+(?P<word>many|much)\s+(?P<rest>.+)$", re.IGNORECASE)
# The object of "how much did <subject> <verb> its/their <noun> ...", in lower
# case (not "... to settle with the Selbury Securities Commission").
_OBJECT = re.compile(
    r"^\S+\s+(?:the\s+)?\S.*?\s(?:its|their|his|her|the)\s+(?P<np>[a-z][a-z0-9\s-]*[a-z])"
)
_BY_HOW = re.compile(r"^by\s+(?=how\s+(?:many|much)\b)", re.IGNORECASE)
# "how many does it ...": a count with no noun of its own.
_HOW_BARE = re.compile(
    r"^how\s+(?:many|much)\s+(?:did|does|do|was|were|is|are|has|have|had|will|would)\b",
    re.IGNORECASE,
)
# An owner's possessive: "Fennick Retail Group's", "Quillmere Foods'".
_POSSESSIVE = re.compile(r"\w['’]s?\s+(?=\S)")
# Where a measure's phrase ends: "scope 1 emissions | in 2024".
_PHRASE_END = _set(
    "in for of at on during by as from between over to since within under after before "
    "according including excluding"
)

# Words that start a time after a measure's phrase: "its revenue | this year".
_TIME = _set("this last next")


@dataclass(frozen=True, slots=True)
class Measure:
    """The measure a question asks an amount of."""

    phrase: str  # as the question writes it: "scope 1 emissions"
    head: str  # the stem of its noun: "emiss"
    labels: tuple[tuple[str, frozenset[str]], ...]  # its numbered labels: (("scope", {"1"}),)
    by_form: bool  # asked by "how many/much", not only by the sources' use of the noun
    counted: bool = False  # "how many": a count
    # The question's own numbers ("scope 1", "No 1", "2024"): not the amount asked for.
    given: frozenset[str] = frozenset()
    # A change is asked ("how much did X cut its emissions"), not a level.
    change: bool = False

    @property
    def in_percent(self) -> bool:
        """Whether a percentage can be an amount of it: of a change, or of a
        measure that is itself a ratio ("gender pay gap", "recycling rate"),
        not of a level or a count ("scope 1 emissions", "turbines": "cut
        emissions by 40%" does not say what they were; "41% of shareholders"
        does not say how many)."""
        return self.change or (
            not self.counted and any(same_word(self.head, word) for word in _ratio_stems())
        )


# Measures that are ratios or changes, whose amounts are percentages.
_RATIO_WORDS = _set(
    """
    share rate percentage proportion ratio margin gap growth yield return turnout efficiency
    reduction cut increase decrease decline fall rise change drop gain
    """
)


@functools.cache
def _ratio_stems() -> tuple[str, ...]:
    # Stemmed on first use: the stemmer is not loaded at import.
    return tuple(stem(word) for word in _RATIO_WORDS)


# A percentage sign or word right after a number.
_PERCENT_AFTER = re.compile(
    r"\s*(?:%|percent\b|per\s?cent\b|percentage[\s-]+points?\b)", re.IGNORECASE
)

# Plurals whose stem is not their singular's: "one person" is an amount of people.
_SINGULAR = {
    "people": "person",
    "men": "man",
    "women": "woman",
    "children": "child",
    "feet": "foot",
    "teeth": "tooth",
    "mice": "mouse",
    "geese": "goose",
}


def _stem(word: str) -> str:
    """The stem of ``word``, an irregular plural's being its singular's."""
    return stem(_SINGULAR.get(word.lower(), word))


def _words(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text)]


def _phrase(text: str) -> str:
    """The words of ``text`` up to the first that ends a noun phrase."""
    out: list[str] = []
    for word in text.split():
        bare = word.strip("?.!,;:").lower()
        if bare in _PHRASE_END or bare in _AUX or (out and bare in _TIME):
            break
        out.append(word.strip("?.!,;:"))
        if word.endswith((",", "?", ";", ":")):
            break
    return " ".join(out)


def _measure(phrase: str, by_form: bool, plural: bool) -> Measure | None:
    # "how many more singles titles": the measure is the singles titles.
    kept = phrase.split()
    while kept and kept[0].lower() in _SKIP:
        kept.pop(0)
    phrase = " ".join(kept)
    words = [w for w in _words(phrase) if w not in _SKIP]
    nouns = [w for w in words if not w.isdigit() and w not in STOPWORDS]
    if not nouns or len(phrase.split()) > _LONGEST:
        return None
    if words[-1][0].isdigit():
        return None  # a rank or a numbered thing ("year-end No 1", "season 17"), not a measure
    head = nouns[0]
    if plural:
        # "how many methanol dual-fuel ships": the counted noun is the last plural.
        plurals = [w for w in nouns if w.endswith("s") and not w.endswith("ss")]
        head = plurals[-1] if plurals else nouns[0]
    elif len(nouns) > 1 and not by_form:
        head = nouns[-1]  # "scope 1 emissions", "total revenue"
    if head in _GENERIC:
        return None
    at = len(words) - 1 - words[::-1].index(head)
    if _stem(head) == "point" and at and words[at - 1] in ("percentage", "basis"):
        # "how many percentage points", "basis points": its unit is the answer,
        # a change of a ratio, not a count.
        return None
    if plural:
        # The counted noun ends what is counted: "how many people live in
        # Paris" counts people, not "people live".
        ends = [i for i, w in enumerate(phrase.split()) if head in _words(w)]
        if ends:
            phrase = " ".join(phrase.split()[: ends[-1] + 1])
    labels = tuple(sorted((w, frozenset(n)) for w, n in numbered_labels(phrase).items()))
    return Measure(phrase=phrase, head=_stem(head), labels=labels, by_form=by_form)


@functools.lru_cache(maxsize=1024)
def asked_measure(question: str) -> Measure | None:
    """The measure ``question`` asks an amount of, or None (module docstring);
    a lead-in phrase is read past (``question_proper``)."""
    text = question_proper(question)
    if len(text) > _LONGEST_QUESTION:
        return None
    # "By how much did ..." asks what "How much did ..." asks.
    text = _BY_HOW.sub("", text)
    measure = _asked(text)
    if measure is None:
        return None
    # A lead-in phrase's numbers ("As of December 31, 2025, ...") are the
    # question's own too.
    given = frozenset(w for w in _words(question) if w[0].isdigit())
    counted = bool(re.match(r"how\s+many\b", text, re.IGNORECASE))
    return replace(measure, counted=counted, given=given)


def _asked(text: str) -> Measure | None:
    if not text:
        return None
    if is_compound(text):
        # Several things asked: one measure only when every part asks an
        # amount of the same one ("How many ships did it order, and how many
        # does it now plan to take?": a bare "how many" counts the same ships).
        parts = compound_parts(text)
        if len(parts) < 2:
            return None  # a clause, not a question of its own: no one measure read
        head, *tail = parts
        measure = _asked(head)
        if measure is None or not all(
            _HOW_BARE.match(part) or _same(_asked(part), measure) for part in tail
        ):
            return None
        return measure
    how = _HOW.match(text)
    if how is not None:
        rest = how.group("rest")
        first = _words(rest)[:1]
        if not first or first[0] in _AUX:
            # "How much did Fennick cut its emissions?": what is measured is
            # the object the verb acts on; "how much did Google pay for
            # YouTube?" names none, its unit is the answer.
            obj = _OBJECT.search(rest)
            if obj is None:
                return None
            # The object is a noun phrase whose last noun is what changed:
            # "its scope 1 emissions", "its revolving credit agreement".
            measure = _measure(_phrase(obj.group("np")), False, False)
            return None if measure is None else replace(measure, by_form=True, change=True)
        return _measure(_phrase(rest), True, how.group("word").lower() == "many")
    kind = answer_type(text)
    if kind not in ("number", ""):
        return None
    noun = _WHAT_NOUN.match(text)
    if noun is not None:
        # "What revenue did ..." asks for an amount; "What type of structure
        # does ..." and "What film did ..." ask for a kind or a name.
        return _measure(noun.group("np"), False, False) if kind == "number" else None
    be = _WHAT_BE.match(text)
    if be is None:
        return None
    # The noun phrase asked for ends at its first preposition ("the population
    # | of the town"); what follows an owner's possessive in it is the measure
    # ("Fennick Retail Group's | scope 1 emissions").
    phrase = _phrase(be.group("rest"))
    owners = list(_POSSESSIVE.finditer(phrase))
    if owners:
        phrase = phrase[owners[-1].end() :]
    elif phrase.lower().startswith("the "):
        phrase = phrase[4:]
    else:
        return None
    return _measure(phrase, False, False)


def bare_count_of(part: str, measure: Measure) -> str:
    """``part`` with the noun a bare "how many/much" leaves out put back:
    "how many does it now plan to take?" → "how many methanol dual-fuel ships
    does it now plan to take?"; any other question as it is."""
    match = _HOW_BARE.match(part)
    if match is None:
        return part
    verb = match.group().split()[-1]
    return f"{match.group()[: -len(verb)]}{measure.phrase} {part[match.end() - len(verb) :]}"


def _same(a: Measure | None, b: Measure) -> bool:
    return a is not None and a.head == b.head and a.labels == b.labels


def _amount_near(
    words: list[str], i: int, given: frozenset[str], skip: frozenset[int] = frozenset()
) -> bool:
    window = [*range(max(0, i - _BEFORE), i), *range(i + 1, min(len(words), i + 1 + _AFTER))]
    return any(j not in skip and _is_amount(words, j, given) for j in window)


def _is_amount(words: list[str], j: int, given: frozenset[str]) -> bool:
    word = words[j]
    if word[0].isdigit():
        return not _YEAR.fullmatch(word) and word not in given
    # "one of the turbines" picks one out, it does not count them.
    return word in _NUMBER_WORDS and not (word == "one" and words[j + 1 : j + 2] == ["of"])


# Words that name a measure whose own word they are not, by the measure's
# stem: a company's revenue is written as its (net) sales, and its sales as
# its revenue. Only the plural "sales": "the sale of its unit for $3 billion"
# is no revenue. ("Turnover" is left out: it is also a workforce measure.)
_ALSO_NAMED: dict[str, frozenset[str]] = {
    "revenu": frozenset({"sales"}),
    "sale": frozenset({"revenue", "revenues"}),
}


# "Sales" that are no revenue: what the company pays for them ("cost of
# sales"), the sales it counts ("unit sales"), and what a "sales tax", a
# "sales force" or "sales and marketing" spend is.
_NOT_REVENUE_AFTER = _words(
    """
    tax taxes force forces staff team teams people representatives reps agents office offices
    commission commissions volume volumes units per
    """
)
_NOT_REVENUE_BEFORE = _words("unit units volume")


def _names_measure(words: Sequence[str], i: int, measure: Measure) -> bool:
    """Whether the lower-case word ``words[i]`` of a text names the measure:
    of its word family (``same_word``) or one of the names it also goes by,
    where it is used as that name ("net sales" for revenue, not "cost of
    sales"; revenue is never a count of sales)."""
    word = words[i]
    if same_word(_stem(word), measure.head):
        return True
    if word not in _ALSO_NAMED.get(measure.head, ()) or measure.counted:
        return False
    before = " ".join(words[max(0, i - 2) : i])
    after = " ".join(words[i + 1 : i + 3])
    return not (
        before in ("cost of", "costs of")
        or before.rpartition(" ")[2] in _NOT_REVENUE_BEFORE
        or after.partition(" ")[0] in _NOT_REVENUE_AFTER
        or after in ("and marketing", "and administrative", "and general")
    )


def _may_name(text: str, measure: Measure) -> bool:
    """False when no word of ``text`` can be of the measure's family: such a
    word shares at least the first four letters of its stem with the
    measure's stem (``same_word``), and stemming changes the ends of words,
    so its first three letters are in the text ("copy" is stemmed "copi").
    A test on the text, before any word is stemmed."""
    lower = text.lower()
    return (
        measure.head[:3] in lower
        or any(plural in lower for plural, one in _SINGULAR.items() if stem(one) == measure.head)
        or any(word in lower for word in _ALSO_NAMED.get(measure.head, ()))
    )


def amount_windows(text: str, measure: Measure) -> list[tuple[int, int]]:
    """The character spans of ``text`` where an amount would be an amount of
    ``measure``: from five words before each word of its family to six after."""
    if not _may_name(text, measure):
        return []
    found = list(_TOKEN.finditer(text))
    words = [token.group().lower() for token in found]
    return [
        (found[max(0, i - _BEFORE)].start(), found[min(len(found) - 1, i + _AFTER)].end())
        for i in range(len(found))
        if _names_measure(words, i, measure)
    ]


def gives_amount(sentence: str, measure: Measure) -> bool:
    """Whether ``sentence`` gives an amount of ``measure`` (module docstring)."""
    # NFKC: a full-width "４０％" is "40%".
    body = unicodedata.normalize("NFKC", strip_dateline(sentence))
    if not _may_name(body, measure):
        return False
    if measure.labels:
        have = numbered_labels(body)
        if not all(have.get(word, set()) & numbers for word, numbers in measure.labels):
            return False
    found = list(_TOKEN.finditer(body))
    words = [m.group().lower() for m in found]
    # A number after one of the measure's label words labels another one
    # ("scope 3 emissions"), and a percentage is an amount only of a change
    # or a ratio (``in_percent``).
    label_words = {word for word, _ in measure.labels}
    skip = {
        j
        for j, m in enumerate(found)
        if j and m.group()[0].isdigit() and words[j - 1] in label_words
    }
    if not measure.in_percent:
        # "40%", "forty per cent", "twenty-five percent": every word of the number.
        for j in reversed(range(len(found))):
            if not (words[j][0].isdigit() or words[j] in _NUMBER_WORDS):
                continue
            end = found[j].end()
            if _PERCENT_AFTER.match(body, end) or (
                j + 1 in skip
                and words[j + 1] in _NUMBER_WORDS
                and not body[end : found[j + 1].start()].strip(" -")
            ):
                skip.add(j)
    skipped = frozenset(skip)
    return any(
        _names_measure(words, i, measure) and _amount_near(words, i, measure.given, skipped)
        for i in range(len(words))
    )


def measured_in(texts: Sequence[str], measure: Measure) -> bool:
    """Whether any of ``texts`` gives an amount of the measure's noun: the
    sources write it as a quantity ("emissions of 4.7 million tonnes")."""
    return any(gives_amount(t, replace(measure, labels=())) for t in texts)


def measure_check(question: str, sources: Sequence[str]) -> Measure | None:
    """The measure a sentence must give an amount of to answer ``question``
    over ``sources``; None when the question asks for no measure."""
    measure = asked_measure(question)
    if measure is None:
        return None
    if measure.by_form or answer_type(question) == "number" or measured_in(sources, measure):
        return measure
    return None


def gives_asked_amount(
    question: str, sentences: Sequence[str], sources: Sequence[str]
) -> npt.NDArray[np.bool_]:
    """Per sentence: whether it gives an amount of what ``question`` measures
    over ``sources`` (``measure_check``); all True when it measures nothing."""
    measure = measure_check(question, sources)
    if measure is None:
        return np.ones(len(sentences), dtype=bool)
    return np.array([gives_amount(s, measure) for s in sentences], dtype=bool)
