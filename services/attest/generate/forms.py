"""Questions answered by deciding, not quoting: choices, yes/no and what two things share.

Three forms of English question are answered by reading the sources for
each thing the question names and deciding between them, not by quoting one
sentence:

* **A choice between two named things** ("Who was born first, Erika Jayne or
  Marco Da Silva?", "Which came out first, Dinosaur or McFarland, USA"): the
  answer names one of them. When the question asks which comes first or
  last in time (born, died, founded, released, "older", "more recent"), each
  option's earliest year in the sentences that name it decides; otherwise
  the option whose sentences best state the rest of the question.
* **A yes/no question about named things** ("Are Ferocactus and Silene both
  types of plant?", "Were Halldór Laxness and Timothy Leary from the same
  country?"): yes when the sentences about every named thing state what the
  question says of them (its content words, stems compared), and for "the
  same ..." / "different ..." when their descriptions share a name-like word
  (a nationality, a place, a family), inverted for "different".
* **What class two named things share** ("What occupation did Nicholas
  Christopher and Roger Ebert share?", "A and B are both what kind of
  film?"): the words both things' definitions say they are (after the first
  verb of being, up to a relative clause or a participle; compared by
  stem), both definitions quoted. A question asking for anything but a
  class ("Which regulator fined both A and B?"), or for a named one (a
  country, a city), is not this form.

Both read names as runs of capitalized words (with digits and short
connectors such as "of" or "de" inside), so they apply to any corpus of
named things; what cannot be parsed is answered the ordinary way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from attest.generate.facts import WORD_VALUES, stem
from attest.generate.text import STOPWORDS, content_tokens, key_terms, tokens


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_AUXILIARIES = _set("is are was were do does did has have had can could will would should")
_CONNECTORS = _set("of the de del der van von da di la le and for on in")
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
# Words that make a choice a question of time, and which end of it is asked for.
_EARLIER = _set("first earlier earliest older oldest before sooner")
_LATER = _set("later latest last younger youngest recently recent newer newest after")
# "younger"/"older" compare birth dates: the younger was born later.
_TIME_NOUNS = _set(
    "born birth died death founded established formed opened released published came "
    "built created started began launched premiered aired written occurred happened"
)
_SAME = _set("same")
_DIFFERENT = _set("different differ differs")
_FILLER = _set("both either all each")
_CHOOSING = _set("which who whom whose")
_PRONOUNS = _set("you i we they he she it one")


@dataclass(frozen=True, slots=True)
class Choice:
    """A question asking which of two named things; ``direction`` is "earlier",
    "later" or "" (not a question of time); ``rest`` is the question without
    the options (what is asked of them)."""

    options: tuple[str, str]
    direction: str
    rest: str


@dataclass(frozen=True, slots=True)
class Polar:
    """A yes/no question about named things: ``relation`` is "same", "different"
    or "" (what ``claim`` says holds of each)."""

    names: tuple[str, ...]
    relation: str
    claim: str


def _is_name_word(word: str) -> bool:
    return bool(word) and (word[0].isupper() or word[0].isdigit())


def _name_run(words: Sequence[str], *, from_end: bool) -> str:
    """The run of name words at the end (or the start) of ``words``: capitalized
    words and digits, with connectors allowed inside ("Bank of America")."""
    seq = list(reversed(words)) if from_end else list(words)
    run: list[str] = []
    for i, word in enumerate(seq):
        bare = word.strip(",;:?!.\"'()")
        if _is_name_word(bare):
            run.append(word)
            continue
        # A connector stays inside a name when a name word follows within two words
        # ("Bank of America", "In the Realm of the Hackers").
        ahead = [w.strip(",;:?!.\"'()") for w in seq[i + 1 : i + 3]]
        inside = (
            bare.lower() in _CONNECTORS
            and bool(run)
            and any(_is_name_word(w) for w in ahead)
            and all(_is_name_word(w) or w.lower() in _CONNECTORS for w in ahead[:1])
        )
        if inside:
            run.append(word)
            continue
        break
    if from_end:
        run.reverse()
    return " ".join(run).strip(" ,;:?!.")


def _option(text: str) -> str:
    """An option as the question writes it, without a lower-case article or
    the quotation marks around it ("the Leonberger", '"Poleconomy"'; "The
    Beatles" keeps its own)."""
    text = text.strip(" ,")
    # A lower-case "the" is the question's article; a capital one may be the
    # name's own ("The Beatles", "The Hague").
    text = re.sub(r"^the\s+", "", text)
    return text.strip("\"“”'‘’ ")


def choice_of(question: str) -> Choice | None:
    """The two options of "..., A or B?" (or "... A or B?", "...: A or B?"), else None."""
    # A colon or a dash before the options sets them off as a comma does.
    text = re.sub(r"\s*(?::|--|—)\s*|\s+–\s+", ", ", question.strip().rstrip("?").strip())
    # Only a question that asks which one ("Which ...", "Who ...", "In which
    # ..."): "What did Apple announce on Monday or Tuesday?" asks for something
    # else, and "Was Paris or London founded first?" is left to the ordinary path.
    if not _CHOOSING & set(tokens(text)[:3]):
        return None
    left, sep, right = text.rpartition(" or ")
    second = _option(right)
    if not sep or not left.strip() or not second:
        return None
    if not _is_name_word(second.split()[0]):
        return None
    tail = ""
    if "," in second:
        # "McFarland, USA" is one name; "John Carpenter, held more roles" is a name
        # and the rest of the question.
        name, _, after = second.partition(",")
        if after.strip() and not _is_name_word(after.split()[0]):
            second, tail = name.strip(), after
    else:
        run = _name_run(second.split(), from_end=False)
        second, tail = run, second[len(run) :]
    head, comma, first = left.rpartition(",")
    first = _option(first)
    if not comma or not first or not _is_name_word(first.split()[0]):
        first = _name_run(left.split(), from_end=True)
        head = left[: left.rfind(first)] if first else left
    if not first or not second or first == second:
        return None
    rest = f"{head} {tail}".strip(" ,")
    words = set(tokens(rest))
    direction = ""
    if words & (_EARLIER | _LATER):
        earlier = bool(words & _EARLIER)
        # "younger"/"older" compare births; "first"/"last" whatever the question names.
        if words & _TIME_NOUNS or words & {"younger", "older", "youngest", "oldest", "first"}:
            direction = "earlier" if earlier else "later"
        elif words & {"recently", "recent", "newer", "newest", "latest", "later"}:
            direction = "later"
    return Choice((first, second), direction, rest)


def _names_a_thing(name: str) -> bool:
    """A name with a capitalized word in it ("Scope 3", not "2050")."""
    return any(w[:1].isupper() for w in name.split())


def polar_of(question: str) -> Polar | None:
    """The named things of a yes/no question ("Are A and B both X?"), else None."""
    words = question.strip().rstrip("?").replace(",", " ").split()
    if not words or words[0].lower() not in _AUXILIARIES or " or " in question:
        return None
    body = [w for w in words[1:] if w.lower() not in _FILLER]
    try:
        cut = next(i for i, w in enumerate(body) if w == "and")
    except StopIteration:
        return None
    if not body or body[0].lower() in _PRONOUNS:
        return None  # "Can you compare A and B?" asks something of the reader
    first = _name_run(body[:cut], from_end=True)
    second = _name_run(body[cut + 1 :], from_end=False)
    if not _names_a_thing(first) or not _names_a_thing(second):
        return None
    before = body[: cut - len(first.split())]
    if len(before) > 3:
        return None  # "Is Shell committed to net zero by 2050 and ...": no pair of names
    claim_words = before + body[cut + 1 + len(second.split()) :]
    if not claim_words and len(second.split()) > 1:
        # "Are both Jim McBride and Neil Jordan American?": the last capitalized
        # word is what is said of them.
        *name, said = second.split()
        second, claim_words = " ".join(name), [said]
    claim = " ".join(claim_words).strip(" ,")
    if not claim:
        return None
    lowered = set(tokens(claim))
    relation = "same" if lowered & _SAME else "different" if lowered & _DIFFERENT else ""
    return Polar((first, second), relation, claim)


# --- reading the sources ------------------------------------------------------------


def _name_words(name: str) -> set[str]:
    return {t for t in content_tokens(name) if not t.isdigit()} or content_tokens(name)


def mentions(name: str, sentence: str) -> float:
    """Share of the name's words the sentence contains."""
    wanted = _name_words(name)
    if not wanted:
        return 0.0
    return len(wanted & content_tokens(sentence)) / len(wanted)


@dataclass(frozen=True, slots=True)
class Place:
    """Where a sentence comes from: its document's title and its position there."""

    title: str = ""
    position: int = 0


def about(name: str, sentences: Sequence[str], places: Sequence[Place] = ()) -> list[int]:
    """Indices of the sentences that name ``name`` (at least half of its words),
    best first: the opening sentence of a document titled with the name (where
    a text defines what it is about), then other sentences of such documents,
    then by how much of the name they contain."""
    out = []
    for i, sentence in enumerate(sentences):
        share = mentions(name, sentence)
        if share < 0.5:
            continue
        place = places[i] if i < len(places) else Place()
        titled = bool(place.title) and mentions(name, place.title) >= 0.5
        out.append((not titled, place.position > 0 or not titled, -share, place.position, i))
    return [key[-1] for key in sorted(out)]


def _titled(name: str, places: Sequence[Place], asked: str, count: int) -> list[int]:
    """Indices (below ``count``) of the sentences of documents titled with
    ``name`` itself, or with it and a qualifier the question ``asked`` says
    ("Lawson (band)" for "Which band …, Lawson or …", not "Lawson (TV
    series)")."""
    want = " ".join(name.casefold().split())
    said = set(tokens(asked))
    out = []
    for i, place in enumerate(places[:count]):
        qualifier = " ".join(re.findall(r"\(([^()]*)\)", place.title))
        bare = " ".join(re.sub(r"\([^()]*\)", " ", place.title).casefold().split())
        if bare == want and (not qualifier or set(tokens(qualifier)) & said):
            out.append(i)
    return out


def year_of(sentence: str, last: bool = False) -> int | None:
    """The year a defining sentence gives first ("(born 1961)", "is a 1998
    film"), or with ``last`` the end of its first span of years ("(May 1,
    1895 – February 10, 1967)": 1967, for a death)."""
    found = [int(y) for y in _YEAR.findall(sentence)]
    if not found:
        return None
    if last:
        span = re.search(r"\(([^()]*)\)", sentence)
        inside = [int(y) for y in _YEAR.findall(span.group(1))] if span else []
        if len(inside) >= 2:
            return inside[-1]
    return found[0]


def stems(text: str) -> set[str]:
    return {stem(t) for t in content_tokens(text)}


def coverage(claim: str, text: str, name_words: set[str]) -> float:
    """Share of the claim's content stems (the names excluded) that ``text`` has."""
    wanted = stems(claim) - {stem(w) for w in name_words}
    if not wanted:
        return 0.0
    return len(wanted & stems(text)) / len(wanted)


def describing_terms(sentence: str, name: str) -> set[str]:
    """The name-like words a sentence uses to describe ``name`` (nationality,
    place, family), the name's own words excluded."""
    return key_terms(sentence) - _name_words(name) - {t for t in key_terms(name)}


_MORE = _set(
    "more most larger largest bigger biggest higher highest greater greatest longer "
    "longest busier busiest"
)
_FEWER = _set("fewer fewest less least smaller smallest lower lowest shorter shortest")


# A sentence that denies what it says of a thing states nothing in its favour.
_NEGATED = re.compile(r"\b(?:not|never|no longer|neither|nor)\b|n't\b", re.IGNORECASE)
_COUNT = re.compile(r"\d{1,3}(?:,\d{3})+|\d+|[A-Za-z]+")


def _quantity(sentence: str, noun: str, name: str = "") -> int | None:
    """The count a sentence gives of ``noun`` ("about 1,200 species", "four
    members"); for a group's members (or musicians) also the size its words
    give the group ``name`` (``_group_size``)."""
    words = _COUNT.findall(sentence)
    want = stem(noun)
    members = noun.lower() in _MEMBER_NOUNS
    for i, word in enumerate(words):
        if stem(word.lower()) != want:
            continue
        for back in range(i - 1, max(-1, i - 4), -1):
            value = words[back].replace(",", "").lower()
            if value.isdigit() and len(value) <= 12:
                if members and not 0 < int(value) <= _MOST_MEMBERS:
                    break  # a year or another figure ("In 2010 the members …")
                return int(value)
            if value in WORD_VALUES:
                return WORD_VALUES[value]
    if members:
        return _group_size(sentence, name)
    return None


_MEMBER_NOUNS = frozenset({"member", "members", "musician", "musicians"})
_MOST_MEMBERS = 100
# A group named by its size ("rock duo", "jazz quartet").
_ENSEMBLES = {
    "duo": 2,
    "trio": 3,
    "quartet": 4,
    "quintet": 5,
    "sextet": 6,
    "septet": 7,
    "octet": 8,
}
_NUMBER_WORD = r"\d{1,2}|" + "|".join(sorted(WORD_VALUES, key=len, reverse=True))
# "trio", "three-piece", "five-member", "4-person": one group's size.
_SIZE = (
    rf"(?:{'|'.join(_ENSEMBLES)})\b"
    rf"|(?:{_NUMBER_WORD})[- ](?:piece|person|member|man|woman)\b"
)
# The size said of the subject ("Brell are an English three-piece rock band",
# "has been a quintet since 2004") or of the group as "the three-piece band".
_SIZE_SAID = re.compile(
    r"\b(?:is|are|was|were|been|became|become|becomes|remains|remained)\s+(?:a|an|the)\s+"
    rf"(?:[\w'’.-]+\s+){{0,3}}?(?P<said>{_SIZE})"
    rf"|\bthe\s+(?P<subject>{_SIZE})\s+(?:band|group|act|outfit|ensemble)\b",
    re.IGNORECASE,
)
# A list of members after the group or a pronoun for it: "Lawson are an
# English pop rock band, consisting of Andy Brown (vocals), …", "It consists of …".
_LISTED = re.compile(
    r"\b(?:it|they|band|group|lineup|line-up|act|duo|trio|quartet|quintet)\b[^.;]{0,40}?"
    r"\b(?:consisting of|consists of|consisted of|comprising|comprises|composed of|made up of)"
    r"\s+(?P<list>[^.;]+)",
    re.IGNORECASE,
)


def _group_size(sentence: str, name: str = "") -> int | None:
    """How many members a sentence gives a group: the last size it says of
    its subject ("are a three-piece band", "has been a quintet", "the
    five-piece band"), a size word right before the group's ``name`` ("UK
    punk trio Test Icicles"), or the people it lists after "consisting of"
    (each with two capitalized words, up to a relative clause). A size said
    of anything else ("a 40-piece orchestra", "a three-piece suit", "the
    five-piece Kasabian") is none."""
    said = [
        (m.start(), m.group("said") or m.group("subject")) for m in _SIZE_SAID.finditer(sentence)
    ]
    if name:
        before = re.compile(rf"\b(?P<size>{_SIZE})\s+{re.escape(name)}\b", re.IGNORECASE)
        said += [(m.start(), m.group("size")) for m in before.finditer(sentence)]
    if said:
        size = max(said)[1].lower()
        if size in _ENSEMBLES:
            return _ENSEMBLES[size]
        value = re.split(r"[- ]", size, maxsplit=1)[0]
        return int(value) if value.isdigit() else WORD_VALUES[value]
    listed = _LISTED.search(sentence)
    if listed is None:
        return None
    names = re.sub(r"\([^()]*\)", " ", listed.group("list"))
    names = re.split(r",?\s+(?:who|which|that|with|formed|founded|since|from)\b", names)[0]
    parts = [p for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", names) if p.strip()]
    people = [p for p in parts if sum(w[:1].isupper() for w in p.split()) >= 2]
    if len(people) >= 2 and len(people) == len(parts):
        return len(people)
    return None


def quantity_noun(rest: str) -> tuple[str, bool] | None:
    """The thing counted in "which has more species" (the last word of the run
    of content words after the comparative, "than" and numbers skipped) and
    whether more of it wins."""
    words = tokens(rest)
    for i, word in enumerate(words):
        if word not in _MORE and word not in _FEWER:
            continue
        run: list[str] = []
        for after in words[i + 1 :]:
            if after == "than" or after.replace(",", "").isdigit():
                continue
            if not after.isalpha() or after in STOPWORDS:
                break
            run.append(after)
        if run:
            return run[-1], word in _MORE
    return None


@dataclass(frozen=True, slots=True)
class Decision:
    """What a form decided: the answer's lead word ("Yes"/"No", or "" for a
    choice), the option picked, and the sentences (indices) to answer with, the
    deciding one first (for a choice, only the picked option's)."""

    lead: str
    picked: str
    sentences: tuple[int, ...]


def choose(choice: Choice, texts: Sequence[str], places: Sequence[Place] = ()) -> Decision | None:
    """Pick one option by the sentences that name each; None when either is
    unnamed or nothing tells them apart."""
    evidence = {o: about(o, texts, places) for o in choice.options}
    if not all(evidence.values()):
        return None
    a, b = choice.options
    pick: str | None = None
    if choice.direction:
        death = bool(set(tokens(choice.rest)) & {"died", "death", "dead"})
        years = {o: year_of(texts[evidence[o][0]], last=death) for o in choice.options}
        ya, yb = years[a], years[b]
        if ya is not None and yb is not None and ya != yb:
            pick = a if (ya < yb) == (choice.direction == "earlier") else b
    counted = quantity_noun(choice.rest) if pick is None else None
    if counted is not None:
        noun, more = counted
        # Counted in the sentences naming the option and in the document
        # titled with it, whose sentences are about it ("It consists of …"),
        # not in one that names the other option too; the first such sentence
        # on a tie.
        counts: dict[str, tuple[int, int, int] | None] = {}
        for o in choice.options:
            other = b if o == a else a
            read = dict.fromkeys([*evidence[o], *_titled(o, places, choice.rest, len(texts))])
            found = [
                (q, -k, i)
                for k, i in enumerate(read)
                if mentions(other, texts[i]) < 0.5
                and (q := _quantity(texts[i], noun, o)) is not None
            ]
            counts[o] = max(found, default=None)
        qa, qb = counts[a], counts[b]
        if qa is not None and qb is not None and qa[0] != qb[0]:
            pick = a if (qa[0] > qb[0]) == more else b
            # The answer quotes the sentence that gives the chosen option's count.
            counting = counts[pick]
            assert counting is not None
            return Decision("", pick, (counting[2],))
    if pick is None:
        # What the question says of the answer, stated in the sentences naming each.
        def stated(option: str) -> float:
            words = _name_words(choice.options[0]) | _name_words(choice.options[1])
            return max(coverage(choice.rest, texts[i], words) for i in evidence[option])

        sa, sb = stated(a), stated(b)
        if sa == sb:
            return None
        pick = a if sa > sb else b
    # Only the chosen option's sentence: an answer that also quoted the other
    # option would name both, and a reader could not tell which it chose.
    return Decision("", pick, (evidence[pick][0],))


def yes_or_no(polar: Polar, texts: Sequence[str], places: Sequence[Place] = ()) -> Decision | None:
    """Yes when the sentences about every named thing state the claim (or, for
    "same"/"different", when their descriptions share a name-like word or not)."""
    names = list(polar.names)
    claim = polar.claim
    evidence: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        found = about(name, texts, places)
        parts = name.split()
        if not found and len(parts) > 1:
            # "Neil Jordan American": a capitalized word after the name is said of it.
            shorter = " ".join(parts[:-1])
            found = about(shorter, texts, places)
            if found:
                names[k], claim = shorter, f"{claim} {parts[-1]}".strip()
                name = shorter
        if not found:
            return None
        evidence[name] = found
    if polar.relation:
        terms = [describing_terms(texts[evidence[n][0]], n) for n in names]
        shared = bool(set.intersection(*terms))
        yes = shared if polar.relation == "same" else not shared
        order = names
    else:
        words = set().union(*(_name_words(n) for n in names))
        covered = {
            n: max(
                0.0 if _NEGATED.search(texts[i]) else coverage(claim, texts[i], words)
                for i in evidence[n][:3]
            )
            for n in names
        }
        yes = all(c >= 0.5 for c in covered.values())
        # A "no" leads with the thing the claim fails for.
        order = sorted(names, key=lambda n: covered[n]) if not yes else names
    return Decision("Yes" if yes else "No", "", tuple(evidence[n][0] for n in order))


@dataclass(frozen=True, slots=True)
class Shared:
    """A question asking what two named things have in common, of a kind it
    names ("What occupation did A and B share?", "A and B are both what kind
    of film?"): the two names and the kind's noun."""

    names: tuple[str, str]
    kind: str


# "share", "in common", or "both" with a verb of being ("are both", "Both A and
# B are ..."): the question asks what holds of both. "Both" after another verb
# ("Which regulator fined both A and B?") asks for a third thing.
_SHARING = re.compile(r"\b(?:share|shares|shared|in\s+common)\b", re.IGNORECASE)
_BOTH = re.compile(r"\bboth\b", re.IGNORECASE)
# "what occupation", "which genre of film", "what type of media": the kind asked.
_KIND_ASKED = re.compile(
    r"\b(?:what|which)\s+(?P<of>(?:kind|type|sort|genre|form)s?\s+of\s+)?(?P<kind>[a-z]+)\b",
    re.IGNORECASE,
)
# The kinds a definition answers: a class ("what kind of film", "which genre of
# music") or one of these nouns. "What targets", "which regulator", "what
# year" ask for something else, which no definition states.
_CLASS_NOUNS = _set(
    "occupation occupations profession professions job jobs career careers genre genres "
    "field fields instrument instruments"
)
# The sentences about a thing, best first (``about``), read for its definition.
_DEFINITIONS_READ = 5
# Where a defining sentence says what its subject is: after its first verb of being.
_COPULA = re.compile(r"\b(?:is|was|are|were)\b", re.IGNORECASE)


def shared_of(question: str) -> Shared | None:
    """The two named things (joined by "and") and the asked class of a
    question about what they share, else None: the class is a noun after
    "kind/type/sort/genre/form of" or one of ``_CLASS_NOUNS``, and the
    question says both have it ("share", "in common", or "both" with a verb
    of being). A choice or a yes/no question is neither."""
    sharing = _SHARING.search(question) or (_BOTH.search(question) and _COPULA.search(question))
    if not sharing or choice_of(question) or polar_of(question):
        return None
    asked = _KIND_ASKED.search(question)
    # A class asked for ("what kind of film", "what occupation"); "which English
    # musician" asks for a person, "what share of revenue" for an amount.
    if asked is None or not asked.group("kind").islower():
        return None
    kind = asked.group("kind")
    if not asked.group("of") and kind not in _CLASS_NOUNS:
        return None
    if kind in _NAMED_KINDS:
        # A place or a nationality is a name, and a name two definitions share
        # ("Classical", "American", "Europe") is seldom the one asked.
        return None
    words = question.strip().rstrip("?").replace(",", " ").split()
    for cut, word in enumerate(words):
        if word != "and":
            continue
        first = _name_run(words[:cut], from_end=True).strip("\"'“”")
        # "Both A and B ...": the filler word opening the question is no name.
        lead, _, rest = first.partition(" ")
        if lead.lower() in _FILLER and rest:
            first = rest
        second = _name_run(words[cut + 1 :], from_end=False).strip("\"'“”")
        if _names_a_thing(first) and _names_a_thing(second) and first != second:
            return Shared((first, second), kind)
    return None


# Kinds whose members are named (a country, a city, a nationality): not asked
# of this form.
_NAMED_KINDS = _set(
    "country countries nationality nationalities city cities state states town place "
    "location region continent language"
)


# Where what a definition says its subject is ends: a relative clause or a
# participle ("directed by", "known for", "born in").
_RELATIVES = _set("who whom whose which that where when while because")
_NEGATIONS = _set("not never no neither nor")
_DEFINITION_ENDS = _set("known born best")


def _described(sentence: str) -> list[str]:
    """The words a defining sentence says its subject is, lower-cased, in
    order: after its first verb of being, up to a relative clause or a
    participle ("is an American novelist, poet and critic, the author of six
    novels" gives novelist, poet, critic, author, novels; "is a 2003
    documentary directed by ..." documentary); names are not read, and a
    definition that denies ("was never a novelist") gives none."""
    copula = _COPULA.search(sentence)
    if copula is None:
        return []
    out: list[str] = []
    for word in re.findall(r"[^\W\d_][\w'’-]*", sentence[copula.end() :]):
        low = word.lower()
        if low in _NEGATIONS:
            return []
        if low in _RELATIVES or low in _DEFINITION_ENDS:
            break
        if word.islower() and len(low) > 4 and low.endswith("ed"):
            break
        if word.islower() and low not in STOPWORDS:
            out.append(low)
    return out


def _defining(sentence: str, name: str, other_name: str | None = None) -> int | None:
    """How closely the sentence defines ``name``, or None when it does not:
    before its first verb of being it names the thing (half of the name's
    words at least) and says little else, a parenthesis and an appositive
    between commas aside ("Roger Joseph Ebert (1942 - 2013) was ...",
    "Liaocheng, also known as the Water City, is ...", not "Norvale Copper
    said its target was ..."): it opens with a word of the name, names no
    possessor, and has at most one lower-case word besides connectors. The
    value is the count of words there that are not the name's, so that
    "Roger Ebert was" defines Roger Ebert more closely than "Roger Ebert
    Should Lay Off the Fatty Foods is" does."""
    copula = _COPULA.search(sentence)
    if copula is None:
        return None
    before = re.sub(r"\([^()]*\)", " ", sentence[: copula.start()])
    before = re.sub(r",[^,]*,", " ", before)
    words = [w for w in re.findall(r"[^\W\d_][\w'’.-]*", before) if w not in _CONNECTORS]
    if mentions(name, before) < 0.5 or re.search(r"['’]s\b", before):
        return None  # not named, or a possessor ("Roger Ebert's wife Chaz was ...")
    # The name opens the sentence (an article aside): "Unlike Roger Ebert, Gene
    # Siskel was ..." and "The father of Roger Ebert was ..." define others.
    # Its first word may be a longer form of the name's ("Matthew" for Matt).
    opening = [w.lower().strip(".") for w in words if w.lower() not in ("the", "a", "an")][:1]
    named = tokens(name)
    if not opening or not named:
        return None
    if opening[0] not in named and not (len(named[0]) >= 3 and opening[0].startswith(named[0][:3])):
        return None
    # A word of the name that a close other name lacks must be there: "John
    # Smith was" does not define John Doe, nor "Windows 98 is" Windows 95.
    if other_name is not None:
        own_words = set(tokens(name)) - set(tokens(other_name))
        if own_words and not own_words & set(tokens(before)):
            return None
    if sum(w[0].islower() and w not in {"a", "an"} for w in words) > 1:
        return None
    own = _name_words(name)
    return sum(w.lower().strip(".") not in own for w in words)


def in_common(
    shared: Shared, texts: Sequence[str], places: Sequence[Place] = ()
) -> Decision | None:
    """What both things are: the words their definitions share (the closest
    definition of each among its first sentences, ``_defining``, the order
    of ``about`` breaking ties), compared by stem, the question's own words
    left out. The lead names the shared words in the first thing's order
    (three at most), and the answer quotes both definitions. None when
    either thing has no definition, one sentence would define both, or
    their definitions share nothing."""
    found: list[list[int]] = []
    for name, other in zip(shared.names, reversed(shared.names), strict=True):
        # The closest definition among the first sentences about it.
        ranked = [
            (extra, k, i)
            for k, i in enumerate(about(name, texts, places)[:_DEFINITIONS_READ])
            if (extra := _defining(texts[i], name, other)) is not None
        ]
        found.append([min(ranked)[2]] if ranked else [])
    # One sentence for both is no comparison ("John Smith" found for "John Doe").
    if not all(found) or found[0][0] == found[1][0]:
        return None
    first, second = (texts[f[0]] for f in found)
    asked = stems(" ".join(shared.names)) | {stem(t) for t in tokens(shared.kind)}
    theirs = {stem(w) for w in _described(second)}
    common: dict[str, str] = {}  # stem -> the first thing's word
    for word in _described(first):
        if stem(word) in theirs and stem(word) not in asked:
            common.setdefault(stem(word), word)
    if not common:
        return None
    return Decision(", ".join(list(common.values())[:3]), "", (found[0][0], found[1][0]))


def named_things(question: str) -> tuple[str, ...]:
    """What a choice or yes/no question names (its options or the things it asks
    about); empty for other questions."""
    choice = choice_of(question)
    if choice is not None:
        return choice.options
    polar = polar_of(question)
    if polar is not None:
        return polar.names
    shared = shared_of(question)
    return shared.names if shared is not None else ()
