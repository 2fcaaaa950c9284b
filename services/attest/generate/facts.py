"""Answer facts: the dates, names and amounts a sentence states, as comparable values.

A factoid question ("when …", "who …", "how much …") is answered by one fact,
and a source backs the answer only if it states that same fact completely:
"November 12" does not back "November 12, 2020", "Barty" does not back
"Ashleigh Barty", "$19 billion" does not back "$19.3 billion". Comparing
words one by one cannot tell these apart ("2020" is everywhere in a 2020
news set), so facts are read into values first:

* a date is (year, month, day) with the parts the text gives, in any of the
  usual English forms ("July 21, 2017", "21st July 2017", "Jul. 21",
  "November 21 of 1998", "June of 2020", "2017-07-21", a bare year); it is stated by a date that
  has every part it has, equal;
* a name is a run of capitalized words that are not in the question, not
  ordinary words of the sources (written in lower case somewhere, or
  capitalized only where a sentence starts: see ``ordinary_words``) and
  not function words; it is stated by a text whose words contain the run;
* an amount is a number with its scale ("19bn" = "19 billion" = 19e9;
  a percentage is its own unit); dates and the question's own numbers are
  not amounts.

A dateline ("Feb 19, 2014 ...") says when a piece appeared, not what it
states, so it is left out.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from attest.generate.measures import amount_windows, asked_measure
from attest.generate.stems import same_word as same_word
from attest.generate.stems import stem as stem
from attest.generate.text import STOPWORDS, WORD, initial_at, role_head, strip_dateline, tokens

_MONTH_NUMBER = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        1,
    )
    for name in names
}
# Months are capitalized in English; the longer names come first so that
# "Sept" is not read as "Sep".
_MONTH = (
    r"(?P<{g}>January|February|March|April|May|June|July|August|September|October"
    r"|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?"
)
_DAY = r"(?P<{g}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<{g}>(?:1[5-9]|20)\d\d)"
_DATE = re.compile(
    "|".join(
        [
            # 2017-07-21
            r"\b(?P<iy>(?:1[5-9]|20)\d\d)-(?P<im>[01]\d)-(?P<id>[0-3]\d)\b",
            # July 21, 2017 / Jul. 21 / July 21st / November 21 of 1998
            rf"\b{_MONTH.format(g='am')}\s+{_DAY.format(g='ad')}\b"
            rf"(?:,?\s+(?:of\s+)?{_YEAR.format(g='ay')}\b)?",
            # 21 July 2017 / 21st of July / 21st of November of 1998
            rf"\b{_DAY.format(g='bd')}\s+(?:of\s+)?{_MONTH.format(g='bm')}"
            rf"(?:,?\s+(?:of\s+)?{_YEAR.format(g='by')}\b)?",
            # June 2020 / June of 2020
            rf"\b{_MONTH.format(g='cm')}(?:\s+of)?,?\s+{_YEAR.format(g='cy')}\b",
            # 2017
            rf"\b{_YEAR.format(g='yy')}\b",
        ]
    )
)
_SCALE = {
    "thousand": 1e3,
    "k": 1e3,
    "million": 1e6,
    "mn": 1e6,
    "m": 1e6,
    "mln": 1e6,
    "billion": 1e9,
    "bn": 1e9,
    "b": 1e9,
    "trillion": 1e12,
    "tn": 1e12,
}
_AMOUNT = re.compile(
    r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"\s*(?P<unit>%|percent\b|per cent\b|percentage[\s-]+points?\b"
    r"|thousand\b|million\b|billion\b|trillion\b|mln\b|mn\b|bn\b|tn\b|[kmb]\b)?",
    re.IGNORECASE,
)
# Amounts in words ("six ships", "twenty million"); "one" is left out, being
# far more often a pronoun or an article ("one of the ...") than an amount.
_UNITS = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen"),
    *("eighteen", "nineteen", "twenty"),
)
_TENS = ("thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# Every number this module reads in words, zero to twenty and the tens: the one
# table the generator's readers of counts and spans share.
WORD_VALUES: dict[str, int] = {word: value for value, word in enumerate(_UNITS)} | {
    word: 10 * k for k, word in enumerate(_TENS, 3)
}
_NUMBER_WORDS = {word: value for word, value in WORD_VALUES.items() if value > 1}
# "twenty-four", "thirty one": a ten and a unit, one amount.
_ONES = {word: value for value, word in enumerate(_UNITS[:10]) if value > 0}
_WORD_AMOUNT = re.compile(
    rf"\b(?:(?P<tens>twenty|{'|'.join(_TENS)})(?:[\s-](?P<ones>{'|'.join(_ONES)}))?"
    rf"|(?P<word>{'|'.join(_NUMBER_WORDS)}))\b"
    r"(?:\s+(?P<unit>percent\b|per cent\b|percentage[\s-]+points?\b"
    r"|thousand\b|million\b|billion\b|trillion\b))?",
    re.IGNORECASE,
)
# Lower-case words that may sit inside a name ("Bank of America", "Vincent van Gogh").
_NAME_JOINERS = frozenset({"of", "de", "da", "del", "der", "van", "von", "la", "le", "du", "bin"})


@dataclass(frozen=True, slots=True)
class Fact:
    """One stated fact of a kind: ``value`` is comparable across texts."""

    kind: str
    value: tuple[object, ...]

    @property
    def specificity(self) -> int:
        """How much the fact says: the number of date parts; 1 for names and amounts."""
        if self.kind == "date":
            return sum(part is not None for part in self.value)
        return 1


@dataclass(frozen=True, slots=True)
class TextFacts:
    """The facts of one kind a text states, and its words (for names)."""

    facts: tuple[Fact, ...]
    words: tuple[str, ...]

    def states(self, fact: Fact) -> bool:
        if fact.kind == "date":
            return any(_date_covers(f.value, fact.value) for f in self.facts)
        if fact.kind == "name":
            # Names are also written in another order ("Liu Yifei", "Yifei Liu").
            return _contains_run(self.words, fact.value) or any(
                set(fact.value) <= set(f.value) for f in self.facts
            )
        if fact.kind == "number":
            return any(_same_amount(f.value, fact.value) for f in self.facts)
        return False

    def agrees(self, fact: Fact) -> bool:
        """Whether the text states ``fact`` or a part of it ("Barty" for "Ashleigh
        Barty", "November 17" for "November 17, 2019"): it does not contradict
        the fact and says at least some of it."""
        if self.states(fact):
            return True
        if fact.kind == "date":
            return any(_date_covers(fact.value, f.value) for f in self.facts)
        if fact.kind == "name":
            return any(set(f.value) <= set(fact.value) for f in self.facts)
        return False


def _date_covers(have: tuple[object, ...], want: tuple[object, ...]) -> bool:
    return all(w is None or h == w for h, w in zip(have, want, strict=True))


def _contains_run(words: Sequence[str], run: tuple[object, ...]) -> bool:
    n = len(run)
    return n > 0 and any(tuple(words[i : i + n]) == run for i in range(len(words) - n + 1))


def _same_amount(have: tuple[object, ...], want: tuple[object, ...]) -> bool:
    (hv, hu), (wv, wu) = have, want
    assert isinstance(hv, float)
    assert isinstance(wv, float)
    return hu == wu and math.isclose(hv, wv, rel_tol=1e-9)


def _dates(text: str) -> list[tuple[tuple[object, ...], tuple[int, int]]]:
    """(year, month, day) with None for the parts not given, and where each date is."""
    out: list[tuple[tuple[object, ...], tuple[int, int]]] = []
    for m in _DATE.finditer(text):
        g = m.groupdict()
        value: tuple[int | None, int | None, int | None]
        if g["iy"]:
            value = (int(g["iy"]), int(g["im"]), int(g["id"]))
        elif g["am"] or g["bm"]:
            year = g["ay"] or g["by"]
            named = _MONTH_NUMBER[(g["am"] or g["bm"]).lower()]
            value = (int(year) if year else None, named, int(g["ad"] or g["bd"]))
        elif g["cm"]:
            value = (int(g["cy"]), _MONTH_NUMBER[g["cm"].lower()], None)
        else:
            value = (int(g["yy"]), None, None)
        day, month = value[2], value[1]
        if (day is not None and not 1 <= day <= 31) or (month is not None and not 1 <= month <= 12):
            continue
        out.append((value, m.span()))
    return out


def _clean(text: str) -> str:
    return strip_dateline(unicodedata.normalize("NFKC", text))


def date_facts(text: str, question: str = "") -> list[Fact]:
    """Dates stated in ``text``; a bare year the question names is not an answer."""
    asked = {int(y) for y in re.findall(r"\b(?:1[5-9]|20)\d\d\b", question)}
    out = []
    for value, _ in _dates(_clean(text)):
        if value[1] is None and value[0] in asked:
            continue
        out.append(Fact("date", value))
    return list(dict.fromkeys(out))


def name_facts(text: str, question: str, common: frozenset[str] = frozenset()) -> list[Fact]:
    """Runs of name words: capitalized, not asked about, never written in lower case.

    Nor are these names: the words of a date ("Tuesday, November 3") and a
    run of weekday or month names alone; the long form of an abbreviation
    the question gives ("United States" or "U.S." for "US"); a title or
    office ("Chairman", "President Joe Biden" names "Joe Biden"); the
    country of a nationality the question gives, or the nationality of a
    country it names ("France" for "Who won the French presidential
    election?"); and, for a
    question asking who holds a role ("Who is the CEO of Google?"), the
    organisation the text gives the role of ("CEO of Google and Alphabet",
    "president of Nintendo of America"): the holder is named elsewhere."""
    asked, abbreviations, head = _asked(question)
    places = _own_places(question)
    out: list[Fact] = []
    run: list[str] = []
    last_end = -1
    initial = False  # the last word was an initial inside a name ("C." of "John C. Bogle")
    text = _clean(text)
    dated = _Spans([span for _, span in _dates(text)])
    owner = _Spans(_role_objects(text, head, asked)) if head else None

    def close() -> None:
        while run and run[-1] in _NAME_JOINERS:
            run.pop()
        # A title before a name is not part of it ("President Joe Biden",
        # "Prime Minister Eva Dvorak"); one inside a name stays ("Amazon
        # Prime Video", "Anna Chancellor").
        while run and (
            run[0] in _TITLES
            or run[0] in _NAME_JOINERS
            or (run[0] == "vice" and len(run) > 1 and run[1] in _TITLES)
        ):
            run.pop(0)
        if run and not _not_a_name(run, abbreviations) and tuple(run) not in places:
            out.append(Fact("name", tuple(run)))
        run.clear()

    for match in WORD.finditer(text):
        word = match.group()
        possessive = word.endswith(("'s", "’s"))
        if possessive:
            word = word[:-2]
        token = word.strip(".-'’").lower()
        gap = text[last_end : match.start()].strip()
        adjacent = last_end >= 0 and (gap == "" or (gap == "." and initial))
        last_end = match.end()
        # An initial ("C." of "John C. Bogle", "A." of "Thomas A. Edison")
        # is part of a name, its full stop no end of it.
        initial = not possessive and initial_at(text, match)
        is_name = (
            word[0].isupper()
            and bool(token)
            and (token not in STOPWORDS or initial)
            and token not in common
            and stem(token) not in asked
            and token.replace(".", "") not in abbreviations
            and token not in _OFFICES
            and not dated(match.start())
            and not (owner is not None and owner(match.start()))
        )
        if not adjacent or not (is_name or (token in _NAME_JOINERS and run)):
            close()
        if is_name or (token in _NAME_JOINERS and run):
            run.append(token)
        # A possessor is a name of its own ("Austria's Peter Handke"), and
        # punctuation after a word (a comma, a period) ends the name.
        after = text[match.end() : match.end() + 1]
        if possessive or (after in '.,;:!?()"”' and not (initial and is_name)):
            close()
    close()
    return list(dict.fromkeys(out))


_WEEKDAYS = frozenset(
    {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
)
_MONTHS = frozenset(name for name in _MONTH_NUMBER if len(name) > 3 or name == "may")
# Offices that are never part of a name, wherever they stand ("Apple CEO Tim
# Cook" names Apple and Tim Cook; "Mortimer J. Buckley (Chairman & CEO)").
_OFFICES = frozenset(
    re.findall(
        r"\S+",
        """
        ceo cfo coo cto cio cmo chairman chairwoman chairperson founder co-founder cofounder
        """,
    )
)
# Titles that are no part of a name before it ("President Joe Biden", "Dr
# Ann Roe"), but may be inside one ("Amazon Prime Video", "Anna Chancellor");
# "vice" only before another title ("Vice President", not "Vice Media").
_TITLES = _OFFICES | frozenset(
    re.findall(
        r"\S+",
        """
        president chief executive officer director governor minister prime secretary senator
        commissioner mayor chancellor treasurer spokesman spokeswoman spokesperson deputy mr
        mrs dr prof professor
        """,
    )
)

# Nationalities and their countries (and a continent's people): in a question
# about the French election, "France" is the question's own subject, not an
# answer, as "French" would be in a question about France.
_NATIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    nationality: tuple(tuple(place.split()) for place in places.split(","))
    for nationality, places in (
        line.strip().split(":")
        for line in """
        american:america,united states,usa,u.s,u.s.a
        british:britain,great britain,united kingdom,uk,u.k
        english:england
        scottish:scotland
        welsh:wales
        irish:ireland
        french:france
        german:germany
        italian:italy
        spanish:spain
        portuguese:portugal
        dutch:netherlands,holland
        belgian:belgium
        swiss:switzerland
        austrian:austria
        swedish:sweden
        norwegian:norway
        danish:denmark
        finnish:finland
        polish:poland
        czech:czech republic,czechia
        hungarian:hungary
        greek:greece
        turkish:turkey
        russian:russia
        ukrainian:ukraine
        croatian:croatia
        serbian:serbia
        chinese:china
        japanese:japan
        korean:korea
        indian:india
        pakistani:pakistan
        thai:thailand
        vietnamese:vietnam
        indonesian:indonesia
        malaysian:malaysia
        filipino:philippines
        australian:australia
        canadian:canada
        mexican:mexico
        brazilian:brazil
        argentine:argentina
        argentinian:argentina
        chilean:chile
        colombian:colombia
        egyptian:egypt
        israeli:israel
        iranian:iran
        iraqi:iraq
        saudi:saudi arabia
        nigerian:nigeria
        kenyan:kenya
        european:europe
        asian:asia
        african:africa
        """.strip().splitlines()
    )
}


@functools.lru_cache(maxsize=512)
def _own_places(question: str) -> frozenset[tuple[str, ...]]:
    """The runs that name the question's own country: the country of a
    nationality it gives ("France" for "French") and the nationality of a
    country it names ("French" for "France")."""
    # Capitalized words only: "china", "turkey" and "polish" in lower case
    # are no country or nationality.
    words = [
        re.sub(r"['’]s$", "", w.strip(".-'’")).lower() if w[:1].isupper() else ""
        for w in WORD.findall(unicodedata.normalize("NFKC", question))
    ]
    text = f" {' '.join(words)} "
    out: set[tuple[str, ...]] = set()
    for nationality, places in _NATIONS.items():
        if f" {nationality} " in text:
            out.update(places)
        for place in places:
            if f" {' '.join(place)} " in text:
                out.add((nationality,))
                out.add(place)
    return frozenset(out)


# Lower-case words that may stand in an organisation's name after a role
# ("CEO of the Bank of England and the PRA").
_OWNER_JOINERS = frozenset({"the", "of", "and", "de", "du", "la", "van", "von"})


@functools.lru_cache(maxsize=512)
def _asked(question: str) -> tuple[frozenset[str], frozenset[str], str]:
    """The question's word stems, its abbreviations ("us" for "US" or "U.S.")
    and the head of the role it asks the holder of (``role_head``)."""
    words = WORD.findall(unicodedata.normalize("NFKC", question))
    # In a question written in capitals every short word looks like one.
    shouted = not any(ch.islower() for ch in question)
    abbreviations = frozenset(
        bare.lower()
        for w in words
        if 2 <= len(bare := re.sub(r"['’]s$", "", w).strip(".-'’").replace(".", "")) <= 6
        and bare.isalpha()
        and bare.isupper()
        and not shouted
    )
    return frozenset(stem(t) for t in tokens(question)), abbreviations, role_head(question)


def _not_a_name(run: Sequence[str], abbreviations: frozenset[str]) -> bool:
    """A run of month or weekday names alone ("June", "Tuesday"), or a run
    whose initials spell one of the question's abbreviations: its long form
    ("united states" for "US"; also a person's name whose initials happen to
    spell one, a rare loss)."""
    if all(w in _MONTHS or w in _WEEKDAYS for w in run):
        return True
    initials = "".join(w[0] for w in run if w not in _NAME_JOINERS)
    return len(initials) >= 2 and initials in abbreviations


# A chief officer's title is written abbreviated or spelled out ("CEO of
# Apple", "the chief executives of Facebook and Apple").
_TITLE_FORMS: dict[str, tuple[str, ...]] = {
    "ceo": ("chief executive officer", "chief executive"),
    "cfo": ("chief financial officer",),
    "coo": ("chief operating officer",),
    "cto": ("chief technology officer",),
    "cio": ("chief information officer", "chief investment officer"),
    "cmo": ("chief marketing officer",),
}


# Words an organisation after a role is read over, at most: a longer run is
# not one organisation's name.
_OWNER_WORDS = 8


@functools.lru_cache(maxsize=64)
def _role_said(head: str) -> re.Pattern[str]:
    """ "<head> of|at|for|in", the head also in its spelled-out forms."""
    forms = sorted({head, *_TITLE_FORMS.get(head, ())}, key=len, reverse=True)
    said = "|".join(r"\s+".join(re.escape(w) for w in form.split()) for form in forms)
    return re.compile(rf"\b(?:{said})(?:e?s)?[ \t]+(?:of|at|for|in)[ \t]+", re.IGNORECASE)


def _role_objects(text: str, head: str, asked: frozenset[str]) -> list[tuple[int, int]]:
    """Where ``text`` gives the organisation of a role whose last word is
    ``head``: the capitalized words after "<head> of|at|for|in", with the
    lower-case words names join with ("CEO of Google and Alphabet").

    Only a run that ends on its own is one: after a word the question names,
    a capitalized word that is not one starts the holder's name ("CEO of
    Google Sundar Pichai"); punctuation, a lower-case word, a line's end or
    the text's end ends it. A run with more than two capitalized words the
    question does not name ("CEO of Alphabet Sundar Pichai"), or one past
    ``_OWNER_WORDS`` words, cannot be told from the holder's name, so it is
    left as it is. Each run is read once: the time is linear in the text."""
    spans: list[tuple[int, int]] = []
    pattern = _role_said(head)
    position = 0
    while (found := pattern.search(text, position)) is not None:
        start = end = found.end()
        after_asked = False
        others = 0
        ended = True
        for words, match in enumerate(WORD.finditer(text, start), 1):
            gap = text[end : match.start()]
            if gap.strip() or "\n" in gap:
                break
            if words > _OWNER_WORDS:
                ended = False
                break
            word = match.group()
            possessive = word.endswith(("'s", "’s"))
            token = (word[:-2] if possessive else word).strip(".-'’").lower()
            if word[0].isupper():
                is_asked = stem(token) in asked
                if after_asked and not is_asked:
                    break
                after_asked = is_asked
                others += not is_asked
            elif token in _OWNER_JOINERS:
                after_asked = False
            else:
                break
            end = match.end()
            if possessive or text[end : end + 1] in '.,;:!?()"”':
                break
        position = end
        if end > start and ended and others <= 2:
            spans.append((start, end))
    return spans


class _Spans:
    """Whether a position lies in any of some character spans, in log time:
    a long text has thousands of amounts and of spans."""

    def __init__(self, spans: Sequence[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [start for start, _ in merged]
        self.ends = [end for _, end in merged]

    def __call__(self, position: int) -> bool:
        i = bisect.bisect_right(self.starts, position) - 1
        return i >= 0 and position < self.ends[i]


def number_facts(text: str, question: str) -> list[Fact]:
    """Amounts stated in ``text``, in digits or in words ("six", "twenty
    million"): not dates and not the question's own numbers. When the
    question asks for an amount of a measure (``measures``: "how many
    turbines"), only the amounts of that measure ("86 ships" answers how many
    ships, "4.7 million tonnes of emissions" in the same sentence does not)."""
    text = _clean(text)
    in_date = _Spans([span for _, span in _dates(text)])
    asked = set(re.findall(r"\d+(?:\.\d+)?", question.replace(",", "")))
    measure = asked_measure(question)
    in_window = _Spans(amount_windows(text, measure)) if measure is not None else None
    out = []
    for m in [*_AMOUNT.finditer(text), *_WORD_AMOUNT.finditer(text)]:
        if in_date(m.start()):
            continue
        if in_window is not None and not in_window(m.start()):
            continue
        number, value = _amount(m)
        if number in asked:
            continue
        if value[1] == "%" and measure is not None and not measure.in_percent:
            continue  # "cut emissions by 40%" is no amount of emissions
        out.append(Fact("number", value))
    return list(dict.fromkeys(out))


def _amount(m: re.Match[str]) -> tuple[str, tuple[float, str]]:
    """An amount match's number as written in digits, and its (value, unit)."""
    found = m.groupdict()
    if found.get("tens"):
        ones = _ONES[found["ones"].lower()] if found["ones"] else 0
        number = str(_NUMBER_WORDS[found["tens"].lower()] + ones)
    elif found.get("word"):
        number = str(_NUMBER_WORDS[found["word"].lower()])
    else:
        number = m.group("num").replace(",", "")
    unit = (m.group("unit") or "").lower()
    if unit in ("%", "percent", "per cent") or unit.startswith("percentage"):
        return number, (float(number), "%")
    return number, (float(number) * _SCALE.get(unit, 1.0), "")


def amounts(text: str) -> list[tuple[tuple[float, str], tuple[int, int]]]:
    """Every amount ``text`` writes that is not part of a date, as (value,
    unit) and where it is: "1,820,000", "1.82 million" and "1.82m" are one
    value, "11" and "eleven" another. ``text`` is read as it is (no dateline
    taken off), so the positions are its own."""
    in_date = _Spans([span for _, span in _dates(text)])
    return [
        (_amount(m)[1], m.span())
        for m in [*_AMOUNT.finditer(text), *_WORD_AMOUNT.finditer(text)]
        if not in_date(m.start())
    ]


def same_amount(a: tuple[float, str], b: tuple[float, str]) -> bool:
    """Whether two (value, unit) amounts are one."""
    return _same_amount(a, b)


def facts_of(text: str, kind: str, question: str, common: frozenset[str]) -> list[Fact]:
    """The facts of ``kind`` that ``text`` states, in text order."""
    if kind == "date":
        return date_facts(text, question)
    if kind == "name":
        return name_facts(text, question, common)
    if kind == "number":
        return number_facts(text, question)
    return []


def text_facts(text: str, kind: str, question: str, common: frozenset[str]) -> TextFacts:
    return TextFacts(tuple(facts_of(text, kind, question, common)), tuple(tokens(_clean(text))))


def primary_fact(
    facts: Sequence[Fact],
    sources: Sequence[TextFacts],
    weights: Sequence[float],
    exclude: int | None = None,
) -> tuple[Fact | None, float]:
    """The fact of ``facts`` the sources agree with most (by summed weight, the
    source ``exclude`` left out), a more specific one on a tie, and its backing."""
    best: Fact | None = None
    best_key = (-1.0, -1)
    for fact in facts:
        support = sum(
            w
            for j, (s, w) in enumerate(zip(sources, weights, strict=True))
            if j != exclude and s.agrees(fact)
        )
        key = (support, fact.specificity)
        if key > best_key:
            best, best_key = fact, key
    return best, max(best_key[0], 0.0)


def completeness(
    facts: Sequence[Fact], kind: str, primary: Fact | None, sources: Sequence[TextFacts]
) -> float:
    """How completely a sentence with ``facts`` answers a question of ``kind``, in
    [0, 1]: a full date is 1, a month and year 2/3, a bare year 1/3; a name is
    the share of the fullest form of it the sources give ("Manziel" is half of
    "Johnny Manziel"); an amount is 1; no fact of the kind is 0; with no kind,
    every sentence is complete."""
    if not kind:
        return 1.0
    if not facts:
        return 0.0
    if kind == "date":
        return max(f.specificity for f in facts) / 3
    if kind == "name" and primary is not None:
        # The fuller forms of a name put given names before it ("Johnny" before
        # "Manziel"); a longer run that goes on after it is a heading
        # ("Peter Handke Lecture"), not a fuller name.
        n = len(primary.value)
        fullest = max(
            (len(f.value) for s in sources for f in s.facts if f.value[-n:] == primary.value),
            default=n,
        )
        return n / max(fullest, n)
    return 1.0
