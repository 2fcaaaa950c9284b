"""Choice, yes/no and what-they-share questions: parsing what they name, and deciding."""

from __future__ import annotations

import pytest

from attest.generate.forms import (
    Decision,
    Place,
    Shared,
    _quantity,
    choice_of,
    choose,
    in_common,
    named_things,
    polar_of,
    quantity_noun,
    shared_of,
    year_of,
    yes_or_no,
)


@pytest.mark.parametrize(
    ("question", "options", "direction"),
    [
        ("Who was born first, Erika Jayne or Marco Da Silva", ("Erika Jayne", "Marco Da Silva"), "earlier"),
        ("who is younger Keith Bostic or Jerry Glanville ?", ("Keith Bostic", "Jerry Glanville"), "later"),
        ("Which came out first, Dinosaur or McFarland, USA", ("Dinosaur", "McFarland, USA"), "earlier"),
        ("Which film was released first: Sacred Planet or Oz the Great and Powerful?",
         ("Sacred Planet", "Oz the Great and Powerful"), "earlier"),
        ("Which person, William Blake Herron or John Carpenter, held more diverse roles?",
         ("William Blake Herron", "John Carpenter"), ""),
        ("Which band is from England, Fireflight or Dirty Pretty Things?",
         ("Fireflight", "Dirty Pretty Things"), ""),
        # An article and quotation marks around an option are not its name; a
        # dash sets the options off as a comma does.
        ("Which dog is a giant breed, the  Leonberger or the Basset Hound?",
         ("Leonberger", "Basset Hound"), ""),
        ('Which came to market first, "Hey Pa! There\'s a Goat on the Roof" or "Poleconomy"',
         ("Hey Pa! There's a Goat on the Roof", "Poleconomy"), "earlier"),
        ("Which of these battles occurred earlier--the Battle of Peleliu or the Battle of Belleau Wood?",
         ("Battle of Peleliu", "Battle of Belleau Wood"), "earlier"),
        ("Which canal began operating first, the Carondelet Canal or the Miami and Erie Canal?",
         ("Carondelet Canal", "Miami and Erie Canal"), "earlier"),
        # A capital "The" may be the name's own.
        ("Which band has more members, The Beatles or Lawson?", ("The Beatles", "Lawson"), ""),
        ("Which happened earlier – the Battle of Peleliu or the Battle of Belleau Wood?",
         ("Battle of Peleliu", "Battle of Belleau Wood"), "earlier"),
    ],
)  # fmt: skip
def test_a_choice_names_its_two_options(
    question: str, options: tuple[str, str], direction: str
) -> None:
    choice = choice_of(question)
    assert choice is not None
    assert (choice.options, choice.direction) == (options, direction)


@pytest.mark.parametrize(
    "question",
    ["What did Norvale Copper report in 2025?", "Did emissions rise or fall?", "Who or what?"],
)
def test_a_question_without_two_named_options_is_no_choice(question: str) -> None:
    assert choice_of(question) is None


@pytest.mark.parametrize(
    ("question", "names", "relation", "claim"),
    [
        ("Are Ferocactus and Silene both types of plant?", ("Ferocactus", "Silene"), "", "types of plant"),
        ("Are both Jim McBride and Neil Jordan American?", ("Jim McBride", "Neil Jordan"), "", "American"),
        ("Were Halldór Laxness and Timothy Leary from the same country?",
         ("Halldór Laxness", "Timothy Leary"), "same", "from the same country"),
        ("Are Freakonomics and In the Realm of the Hackers both documentaries?",
         ("Freakonomics", "In the Realm of the Hackers"), "", "documentaries"),
    ],
)  # fmt: skip
def test_a_yes_no_question_names_what_it_asks_about(
    question: str, names: tuple[str, ...], relation: str, claim: str
) -> None:
    polar = polar_of(question)
    assert polar is not None
    assert (polar.names, polar.relation, polar.claim) == (names, relation, claim)
    assert named_things(question) == names


def test_questions_of_other_forms_name_nothing() -> None:
    assert polar_of("How much did Norvale Copper cut its emissions?") is None
    assert named_things("How much did Norvale Copper cut its emissions?") == ()


def test_years_of_a_defining_sentence() -> None:
    assert year_of("Ralph Murphy (May 1, 1895 – February 10, 1967) was a director.") == 1895
    assert (
        year_of("Ralph Murphy (May 1, 1895 – February 10, 1967) was a director.", last=True) == 1967
    )
    assert year_of("The Agronomist is a 2003 documentary film.") == 2003
    assert year_of("No year here.") is None


def test_the_thing_counted_and_which_way() -> None:
    assert quantity_noun("Which genus has more species") == ("species", True)
    assert quantity_noun("Who has written more than 300 papers") == ("papers", True)
    assert quantity_noun("Which band has fewer members") == ("members", False)
    assert quantity_noun("Which writer was from England") is None


BORN = [
    "Erika Girardi (born 10 July 1971), known professionally as Erika Jayne, is a singer.",
    "Marco Da Silva (born 1977) is a dancer and choreographer.",
    "Marco Da Silva toured with her in 1989.",
]
PLACES = [Place("Erika Jayne", 0), Place("Marco Da Silva", 0), Place("Marco Da Silva", 1)]


def test_a_choice_of_time_reads_each_option_defining_sentence() -> None:
    first = choose(choice_of("Who was born first, Erika Jayne or Marco Da Silva?"), BORN, PLACES)  # type: ignore[arg-type]
    assert first is not None
    assert (first.picked, first.sentences) == ("Erika Jayne", (0,))
    younger = choose(choice_of("Who is younger, Erika Jayne or Marco Da Silva?"), BORN, PLACES)  # type: ignore[arg-type]
    assert younger is not None
    assert younger.picked == "Marco Da Silva"


def test_a_choice_by_count_compares_the_numbers_stated() -> None:
    texts = [
        "Salvia is the largest genus of plants in the sage family, with nearly 1000 species.",
        "Arachis is a genus of about 70 species of annual and perennial plants.",
    ]
    places = [Place("Salvia", 0), Place("Arachis", 0)]
    decided = choose(choice_of("Which genus has more species, Salvia or Arachis?"), texts, places)  # type: ignore[arg-type]
    assert decided is not None
    assert decided.picked == "Salvia"
    fewer = choose(choice_of("Which genus has fewer species, Salvia or Arachis?"), texts, places)  # type: ignore[arg-type]
    assert fewer is not None
    assert fewer.picked == "Arachis"
    # Counts in words, past twelve too: the generator reads one table of them.
    words = ["The Harrow Quartet has fifteen members.", "The Brell Ensemble has forty members."]
    bands = [Place("Harrow Quartet", 0), Place("Brell Ensemble", 0)]
    larger = choose(  # type: ignore[arg-type]
        choice_of("Which has more members, Harrow Quartet or Brell Ensemble?"), words, bands
    )
    assert larger is not None
    assert larger.picked == "Brell Ensemble"


def test_an_option_no_source_names_leaves_the_choice_undecided() -> None:
    assert (
        choose(choice_of("Who was born first, Erika Jayne or Ada Lovelace?"), BORN, PLACES) is None
    )  # type: ignore[arg-type]


NATIONS = [
    "James McBride (born 1941) is an American film director.",
    "Neil Patrick Jordan (born 1950) is an Irish film director and novelist.",
]
NATION_PLACES = [Place("Jim McBride", 0), Place("Neil Jordan", 0)]


def test_yes_when_every_named_thing_is_said_to_be_what_the_question_says() -> None:
    both = yes_or_no(
        polar_of("Are both James McBride and Neil Jordan film directors?"), NATIONS, NATION_PLACES
    )  # type: ignore[arg-type]
    assert both is not None
    assert both.lead == "Yes"
    american = yes_or_no(
        polar_of("Are both James McBride and Neil Jordan American?"), NATIONS, NATION_PLACES
    )  # type: ignore[arg-type]
    assert american is not None
    # "No", led by the one the claim fails for.
    assert (american.lead, american.sentences[0]) == ("No", 1)


def test_same_and_different_compare_what_describes_each() -> None:
    same = yes_or_no(
        polar_of("Are James McBride and Neil Jordan from the same country?"),  # type: ignore[arg-type]
        NATIONS,
        NATION_PLACES,
    )
    assert same is not None
    assert same.lead == "No"
    different = yes_or_no(
        polar_of("Are James McBride and Neil Jordan from different countries?"),  # type: ignore[arg-type]
        NATIONS,
        NATION_PLACES,
    )
    assert different is not None
    assert different.lead == "Yes"


@pytest.mark.parametrize(
    "question",
    [
        "Shell or :",
        "Which is it, Tea or :?",
        "Which, Coffee or ,",
        "Should investors buy Tesla or Ford stock?",
        "What did Apple announce on Monday or Tuesday?",
        "Was Paris or London founded first?",
        "",
        "?",
        " or ",
    ],
)
def test_odd_or_open_questions_are_no_choice(question: str) -> None:
    assert choice_of(question) is None


@pytest.mark.parametrize(
    "question",
    [
        "Can you compare Tesla and Ford?",
        "Do you know what Tesla and SpaceX make?",
        "Is Shell committed to net zero by 2050 and Scope 3 targets?",
        "Is and?",
        "",
    ],
)
def test_questions_that_ask_no_yes_or_no_about_two_names_are_left_alone(question: str) -> None:
    assert polar_of(question) is None


def test_counts_with_thousands_separators() -> None:
    texts = ["Shell has 950 employees there.", "BP has 1,200 employees there."]
    places = [Place("Shell", 0), Place("BP", 0)]
    decided = choose(choice_of("Which has more employees, Shell or BP?"), texts, places)  # type: ignore[arg-type]
    assert decided is not None
    assert decided.picked == "BP"


def test_a_groups_members_are_counted_from_its_size_and_the_names_it_lists() -> None:
    texts = [
        "Brell are an English three-piece rock band formed in Leeds.",
        "Harrow are a folk duo from Cork.",
        "Quill are an Irish band.",
        # Its page's later sentences are about it though they do not name it.
        "It consists of lead vocalist Ann Roe, keyboardist Ed Lyle, and drummer Jo Pike, and "
        "bassist Cy Mott (since 2019).",
        "Vell is a band consisting of Ann Roe (vocals, guitar), Ed Lyle and Jo Pike.",
        "Ossa is a one-man band from Oslo.",
    ]
    places = [
        Place("Brell", 0),
        Place("Harrow", 0),
        Place("Quill (band)", 0),
        Place("Quill (band)", 1),
    ]
    places += [Place("Vell", 0), Place("Ossa", 0)]

    def picked(question: str) -> str | None:
        decided = choose(choice_of(question), texts, places)  # type: ignore[arg-type]
        return None if decided is None else decided.picked

    assert picked("Which band has more members, Brell or Harrow?") == "Brell"
    assert picked("Which band has more members, Harrow or Quill?") == "Quill"
    # The answer quotes the sentence that gives the chosen option's count.
    quill = choose(choice_of("Which band has more members, Harrow or Quill?"), texts, places)  # type: ignore[arg-type]
    assert quill is not None
    assert quill.sentences == (3,)
    assert picked("Which band has fewer members, Vell or Quill?") == "Vell"
    assert picked("Which band has more members, Ossa or Harrow?") == "Harrow"
    # A list that is not of people counts nothing; a number beside the noun comes first.
    assert _quantity("An album consisting of songs and interludes.", "members") is None
    assert _quantity("The trio has grown to five members.", "members") == 5
    assert _quantity("A duo of dancers and 40 species.", "species") == 40
    # Only a size said of the group itself, the last one it says.
    for sentence, size in (
        ("In 2010 the members moved to London.", None),
        ("The quartet's 2001 album featured a 40-piece orchestra.", None),
        ("Brell also plays in the jazz trio Kell.", None),
        ("In 2012 they supported the five-piece Kasabian on tour.", None),
        ("Ann wore a three-piece suit.", None),
        ("Brell released a duo of albums.", None),
        ("Their debut EP consists of Love Me, Hold On and Stay.", None),
        ("Formerly a one-man project, Brell became a five-piece band in 2005.", 5),
        ("Brell formed as a trio in 1999 and has been a quintet since 2004.", 5),
        ("Led by front man Ann Roe, the five-piece band toured Europe.", 5),
        ("Ann Roe played in UK punk trio Brell.", 3),
        ("Brell is a band consisting of Ann Roe, Ed Lyle and Jo Pike, who met in Leeds.", 3),
    ):
        assert _quantity(sentence, "members", "Brell") == size, sentence
    # A sentence naming both options counts for neither; a document titled with
    # the option counts only if its qualifier is what the question asks about.
    both = [
        "Brell are an English five-piece band from Leeds.",
        "Harrow are an Irish folk duo from Cork.",
        "In 2005 Harrow toured with the five-piece band Brell.",
        "The series starred a five-person cast.",
    ]
    spread = [
        Place("Brell", 0),
        Place("Harrow", 0),
        Place("Tour", 0),
        Place("Harrow (TV series)", 0),
    ]
    decided = choose(choice_of("Which band has more members, Brell or Harrow?"), both, spread)  # type: ignore[arg-type]
    assert decided == Decision("", "Brell", (0,))


def test_a_denial_does_not_count_for_yes() -> None:
    texts = [
        "Amazon did not sign the Climate Pledge in 2019.",
        "Microsoft signed the Climate Pledge in 2019.",
    ]
    places = [Place("Amazon", 0), Place("Microsoft", 0)]
    polar = polar_of("Did Amazon and Microsoft both sign the Climate Pledge?")
    assert polar is not None
    decided = yes_or_no(polar, texts, places)
    assert decided is not None
    assert (decided.lead, decided.sentences[0]) == ("No", 0)


@pytest.mark.parametrize(
    ("question", "shared"),
    [
        (
            "What occupation did Nicholas Christopher and Roger Ebert share?",
            Shared(("Nicholas Christopher", "Roger Ebert"), "occupation"),
        ),
        (
            '"A Summer in the Cage" and "American Hardcore" are both what kind of film?',
            Shared(("A Summer in the Cage", "American Hardcore"), "film"),
        ),
        (
            "What type of media does Bitter Jester and Sicko have in common?",
            Shared(("Bitter Jester", "Sicko"), "media"),
        ),
        (
            "Both Eric Ambler and Carol Shields are best known for what profession?",
            Shared(("Eric Ambler", "Carol Shields"), "profession"),
        ),
        # "Both" after another verb asks for a third thing; "share" as a noun.
        ("Which regulator fined both Norvale Copper and Quaystone Telecom?", None),
        ("Which company owns both Instagram and WhatsApp?", None),
        ("Both Truth in Science and Discovery embrace what campaign?", None),
        ("What share of revenue did Apple and Google both report?", None),
        # Only a class is asked: not a year, an amount or a third thing.
        ("In which year were Apple and Google both founded?", None),
        ("What targets do Norvale Copper and Quillmere Foods share?", None),
        # A named class (a country, a city) is not asked of this form.
        ("Liaocheng and Shayang County are both located in which country?", None),
        ("Which country were both Mozart and Haydn from?", None),
        # A person asked for, not a kind: "which English musician".
        ('Which English musician is known for both "See Yourself" and "Taxman"?', None),
        # Nothing shared asked, or one thing only.
        ("What occupation did Nicholas Christopher have?", None),
        ("What did Apple and Google both announce?", None),
        # A choice or a yes/no question has its own form.
        ("Are Eric Ambler and Carol Shields both authors?", None),
        ("Which occupation do both share, Ambler or Shields?", None),
    ],
)
def test_a_question_about_what_two_things_share(question: str, shared: Shared | None) -> None:
    assert shared_of(question) == shared


def test_what_two_things_share_is_what_both_definitions_say() -> None:
    texts = [
        "Nicholas Christopher (born 1951) is an American novelist, poet and critic, the author of "
        "six novels.",
        "He lives in New York.",
        "Roger Joseph Ebert (1942 - 2013) was an American film critic, historian, journalist, "
        "screenwriter, and author.",
        "Liaocheng is a prefecture-level city in western Shandong province, China.",
        "Shayang County is a county of Hubei province, China.",
    ]
    places = [Place("Nicholas Christopher", 0), Place("Nicholas Christopher", 1)]
    places += [Place("Roger Ebert", 0), Place("Liaocheng", 0), Place("Shayang County", 0)]
    shared = shared_of("What occupation did Nicholas Christopher and Roger Ebert share?")
    assert shared is not None
    decided = in_common(shared, texts, places)
    # The first thing's order; a nationality is no occupation; both sentences quoted.
    assert decided == Decision("critic, author", "", (0, 2))
    # Definitions that share nothing, or a thing no sentence names: undecided.
    apart = Shared(("Nicholas Christopher", "Liaocheng"), "occupation")
    assert in_common(apart, texts, places) is None
    assert in_common(Shared(("Roger Ebert", "Gene Siskel"), "occupation"), texts, places) is None
    # Two names one sentence would define are no comparison, and a word of
    # one name the other lacks must be there.
    smiths = ["John Smith was an English painter and sculptor.", "Jane Roe is a painter."]
    both = shared_of("What occupation did John Smith and John Doe share?")
    assert both is not None
    assert in_common(both, smiths) is None
    windows = ["Windows 98 is a consumer operating system.", "Windows 95 is an operating system."]
    versions = shared_of("What type of software are Windows 95 and Windows 98 both?")
    assert versions is not None
    assert in_common(versions, windows) == Decision("operating, system", "", (1, 0))
    # A sentence about someone else, or one that denies, defines nothing.
    ebert = Shared(("Roger Ebert", "John Grisham"), "occupation")
    grisham = "John Grisham is an American lawyer and novelist."
    for other in (
        "Roger Ebert's wife Chaz was a lawyer.",
        "Unlike Roger Ebert, Gene Siskel was a lawyer.",
        "The father of Roger Ebert was a lawyer.",
        "Roger Ebert was never a lawyer or a novelist.",
    ):
        assert in_common(ebert, [other, grisham]) is None, other
    # A participle ends the class; "daily" and "family" do not.
    papers = [
        "The Guardian is a British daily newspaper.",
        "The Times is a British daily newspaper.",
    ]
    newspaper = Shared(("The Guardian", "The Times"), "newspaper")
    assert in_common(newspaper, papers) == Decision("daily", "", (0, 1))
    films = ["Heat is a 1995 crime film directed by Michael Mann.", "Ronin is a 1998 film."]
    film = shared_of("Heat and Ronin are both what kind of film?")
    assert film is not None
    assert in_common(film, films) is None, "'film' is the kind asked, 'directed' no class"
    # Only a sentence that defines the thing is read: news about it is not.
    news = [
        "Norvale Copper said on Monday that its new target was a 40% cut in emissions.",
        "Quillmere Foods said its target was a 30% cut in emissions by 2030.",
    ]
    targets = Shared(("Norvale Copper", "Quillmere Foods"), "occupation")
    assert in_common(targets, news) is None
