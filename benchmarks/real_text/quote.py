"""Passage prompts: a passage of 80-200 words to repeat, correct, rewrite in another register,
quote from or summarise. Names are ``quote-NN``; every passage is written for this file."""

from __future__ import annotations

from benchmarks.real_text.prose import prose

_ORCHARD = prose("""
    The Hollin Lane community orchard is open to everyone from dawn until dusk. Fruit may be
    picked by anyone who has helped at a work morning during the season, and by any child
    accompanied by an adult. Please take only what you will eat within a week, and leave the
    lower branches for people who cannot reach higher. Ladders are kept in the green shed; return
    them folded and chained. Dogs are welcome on a lead but must be kept away from the compost
    bays. Pruning, grafting and spraying are done only by the orchard team, so please do not
    cut or treat any tree yourself, even if it looks diseased. Report problems in the notebook
    that hangs inside the shed door.
""")

_WATER_NOTICE = prose("""
    Dear residents, we are writing to let you know that the water supply to Calder Court will be
    interupted on Tuesday between nine in the morning and four in the afternoon. Engineers need
    to replace a section of the main pipe that runs beneath the car park, which has been leaking
    for several weeks. During this time taps and toilets will not work, so we recomend filling a
    few bottles the evening before. Bottled water will be avaliable at the reception desk for
    anyone who needs it. When the supply returns the water may look cloudy for a short while;
    this is harmless and will clear if you run the cold tap for a minute or two. We apologise
    for the inconvenence and thank you for your patience.
""")

_BOOT_REVIEW = prose("""
    ok so I've had these boots for about three months now and honestly they're great. I did a
    bunch of muddy walks in them, a couple of really rocky ones, and one day where it didn't stop
    raining for like six hours, and my feet stayed dry the whole time. They felt a bit stiff for
    the first week but after that they were fine. The laces are kind of cheap though, one of
    them already snapped, so I'd swap those out straight away. Also they run small, I normally
    wear a 42 and had to go up to a 43. Would buy again, just not at full price.
""")

_LICHEN = prose("""
    Lichens grow on old gravestones so slowly that they can be used as clocks. A lichen is not a
    single organism but a partnership: a fungus builds the body and shelters a population of
    algae or cyanobacteria, which make sugar from sunlight and share it. On a bare surface the
    partnership spreads outwards in a roughly circular patch, often by less than a millimetre a
    year. Because a gravestone carries the date on which it was set up, researchers can measure
    the widest patches on stones of known age and work out how fast a given species grows in a
    given climate. The method, called lichenometry, is then used to date rockfalls and the
    retreat of ice, where no written date exists.
""")

_BAKERY_APOLOGY = prose("""
    To our customers: On Saturday morning a fault in our main oven meant that we could not bake
    the usual bread and pastries, and we opened two hours late with only part of our range. We
    know that many of you had placed orders for family occasions, and we are sorry that some of
    those orders could not be filled. Everyone affected has been contacted and refunded in full.
    The oven has now been repaired and inspected, and we have arranged for a second oven to be
    available in case anything similar happens again. Thank you for your understanding, and for
    the kind messages many of you sent to our staff.
""")

_CANAL_TOWN = prose("""
    Brindlemoor grew up around a single lock on the canal. In the early years the lock keeper's
    cottage was the only building, and boats waiting to pass would moor along the towpath for
    the night. A blacksmith set up a forge to shoe the horses that pulled the boats, then an inn
    opened to feed their crews, and within thirty years there was a chapel, a school and a row of
    warehouses. When the railway arrived the canal trade faded quickly. The warehouses were
    turned into flats, the forge became a garage, and the inn is now the only business that has
    done the same job for its entire history.
""")

_NIGHT_MARKET = prose("""
    By eight o'clock the car park behind the bus station has become a market. Generators hum
    under the trestle tables, strings of bulbs sag between lamp posts, and the air smells of
    charcoal, frying dough and diesel. A man sells nothing but socks, arranged by colour like a
    paint chart. Two sisters fold dumplings faster than the eye can follow and call out the
    number of each order without looking up. Near the exit a boy with a folding table repairs
    phone screens by the light of a head torch, and the queue in front of him is longer than the
    one for food.
""")

_LABEL_PRINTER = prose("""
    To load a new roll of labels, first switch the printer off and open the top cover by
    pressing the grey button on its right side. Lift the roll holder out and slide the new roll
    onto it so that the labels unwind from the top, facing upwards. Put the holder back into its
    slots, then pull the end of the roll forward until it passes under the guide and out of the
    front slot by about two centimetres. Close the cover firmly until it clicks. Switch the
    printer on and hold the feed button for two seconds; the printer will advance the roll and
    measure the length of one label automatically.
""")

_TRIP_LETTER = prose("""
    Dear parents and carers, Year 5 will visit the Westbrook wetland centre on Thursday 12 June.
    The coach will leave school at 9:15 and return by 3:00, so the school day will end at the
    usual time. Children will spend the morning pond-dipping and the afternoon on a guided walk
    to the bird hides. Please send your child with a packed lunch in a bag they can carry, a
    water bottle, a waterproof coat and shoes that can get muddy. There is no charge for the
    trip. Please sign and return the permission slip by Friday 6 June. If your child needs
    medicine during the day, let the class teacher know in writing.
""")

_HANDWRITING = prose("""
    Handwriting used to be treated as a window onto character. Victorian employers asked for
    applications written by hand, and a neat, even script was taken as evidence of patience and
    honesty. Today most adults write by hand only for shopping lists and birthday cards, and
    many find that their writing has become cramped and slow from lack of practice. Teachers are
    divided on whether it still matters. Some argue that the time spent on joined-up writing
    would be better spent on typing; others point to studies suggesting that students who take
    notes by hand remember more, perhaps because writing slowly forces them to choose what to
    keep.
""")

_EXPLORER = prose("""
    Day 14. The wind dropped in the night and we woke to a silence so complete that Harriet said
    she could hear her own watch. We broke camp by seven and followed the ridge north. The snow
    crust held for the first hour, then softened, and by noon we were sinking to the knee with
    every step. Tomas fell behind with the sledge and we waited for him at a cairn that someone
    had built long before us; there was a tin inside with a pencil stub and no note. We made
    eleven kilometres in all. Tonight the stove is sulking and dinner is late.
""")

_TERMS = prose("""
    You may cancel your membership at any time from the Account page. If you cancel within
    fourteen days of joining, we will refund the full membership fee. After fourteen days,
    cancellation takes effect at the end of the current billing period and no partial refund is
    given for the remaining days. Any classes you have already booked for dates after the
    cancellation takes effect will be removed, and their credits will not be returned. We may
    change these terms by giving you at least thirty days' notice by email; if you do not accept
    the change, you may cancel before it takes effect and receive a refund for any unused,
    prepaid period.
""")

_COUNCIL_MINUTES = prose("""
    The meeting opened at 7:05 pm with eleven members present. The minutes of the previous
    meeting were approved without changes. The treasurer reported that the repair of the hall
    roof had cost 2,340 pounds, slightly less than the estimate, and that the reserve fund now
    stands at 5,100 pounds. A proposal to install a bicycle rack outside the hall was discussed;
    several members supported it, but the caretaker raised a concern about blocking the fire
    exit. It was agreed that the caretaker and the chair would find a suitable location before
    the next meeting. The meeting closed at 8:20 pm.
""")

_RADIO_PLAY = prose("""
    MARGARET: You've moved the wardrobe again. ARTHUR: I haven't touched the wardrobe.
    MARGARET: It was under the window this morning. Now it's by the door. ARTHUR: Then perhaps
    the wardrobe moved itself. MARGARET: Arthur, it weighs as much as a small car. ARTHUR: I'm
    aware of what it weighs. I carried it up those stairs in nineteen seventy-two. MARGARET: Then
    who moved it? ARTHUR: I'd rather not say. MARGARET: Is it Dennis again? ARTHUR: Dennis has
    been very helpful since his retirement. MARGARET: Dennis has been in our house every day since
    his retirement.
""")

_SOUP = prose("""
    Heet a splash of oil in a large pot and soften one chopped onion, two carrots and a stick of
    celery for about ten minuts, stirring now and then. Add two cloves of garlic and a teaspoon
    of ground cumin and cook for one more minute. Tip in 250 grams of red lentils, a tin of
    chopped tomatos and a litre and a half of stock. Bring it to the boil, then turn the heat
    down and let it simmer for twenty five minutes, until the lentils have fallen apart. Season
    with salt, pepper and a squeze of lemon, and blend half of it if you like a thicker soup.
""")

_COMMUTE = prose("""
    The 7:42 from Ashby is always late, and everyone on the platform knows it. Regulars stand in
    the same places every morning: the woman with the cello case at the far end, where the last
    carriage stops, the two students by the timetable, and a man in a grey suit who reads the
    same paperback every day and never seems to turn a page. When the train finally arrives,
    nobody hurries. They have learnt that it will wait a further three minutes for the connecting
    bus, and that the seats on the left are warmer in winter.
""")

QUOTE = {
    "quote-01": f"Repeat the following notice exactly, word for word:\n\n{_ORCHARD}",
    "quote-02": "Correct the spelling mistakes in this letter and return the whole letter, "
                f"otherwise unchanged:\n\n{_WATER_NOTICE}",
    "quote-03": "Rewrite this product review in a formal register suitable for a consumer "
                f"magazine, keeping every point it makes:\n\n{_BOOT_REVIEW}",
    "quote-04": f"Summarise this passage in three sentences:\n\n{_LICHEN}",
    "quote-05": "Rewrite this notice in a warm, informal tone for a social media post, keeping "
                f"all the facts:\n\n{_BAKERY_APOLOGY}",
    "quote-06": "Quote, word for word, the sentence of this passage that explains what "
                f"happened to the warehouses, then the sentence after it.\n\n{_CANAL_TOWN}",
    "quote-07": "Rewrite this passage in the past tense, changing nothing else, and return "
                f"the whole passage:\n\n{_NIGHT_MARKET}",
    "quote-08": "Turn these instructions into a numbered list of steps, keeping the wording of "
                f"each step:\n\n{_LABEL_PRINTER}",
    "quote-09": "Copy this letter exactly, but change the date of the visit to Thursday 19 June "
                f"and the deadline for the slip to Friday 13 June:\n\n{_TRIP_LETTER}",
    "quote-10": "Put the following paragraph inside a Markdown block quote, unchanged, and add "
                f"one line of commentary below it:\n\n{_HANDWRITING}",
    "quote-11": "Repeat this journal entry exactly, inside quotation marks, then say in one "
                f"sentence what the mood of the writer is:\n\n{_EXPLORER}",
    "quote-12": "Rewrite these terms in plain English for a twelve-year-old, sentence by "
                f"sentence, keeping every condition:\n\n{_TERMS}",
    "quote-13": "Copy these minutes exactly, but replace the word 'caretaker' with 'site "
                f"manager' wherever it appears:\n\n{_COUNCIL_MINUTES}",
    "quote-14": "Reformat this radio play excerpt so that each line of dialogue is on its own "
                f"line, starting with the speaker's name:\n\n{_RADIO_PLAY}",
    "quote-15": "Fix the spelling in this recipe and return it in full, with nothing added:"
                f"\n\n{_SOUP}",
    "quote-16": "Repeat this paragraph word for word, then list the four regulars it mentions."
                f"\n\n{_COMMUTE}",
}
