"""Multi-turn prompts: conversations whose earlier turns (user, assistant, ...) are written out
and whose last turn is the user's. Ten end with a request for earlier text back (edited, sorted,
tabulated: 01, 03, 04, 06, 07, 09, 11, 12, 14, 16), so copying pays; six move on to something
new. Names are ``multi_turn-NN``."""

from __future__ import annotations

from benchmarks.real_text.prose import code, prose

_TABLE_CODE = code('''
    def conversion_table(start, stop):
        """Celsius and Fahrenheit side by side, one row per whole degree Celsius."""
        rows = []
        for celsius in range(start, stop + 1):
            fahrenheit = celsius * 9 / 5 + 32
            rows.append(f"{celsius:>5} C  {fahrenheit:>6.1f} F")
        return "\\n".join(rows)
''')

_HEATING_EMAIL = prose("""
    Dear Mr Okafor,

    I am writing to let you know that the heating in flat 4 has stopped working. The radiators
    have been cold since Sunday evening, and the boiler display shows error code E119. The flat
    is getting very cold at night, so I would be grateful if you could arrange for an engineer
    to visit as soon as possible. I am at home most mornings and can give access at short
    notice.

    Thank you for your help.

    Kind regards,
    Dana Whitfield
""")

_PACKING = prose("""
    Here is a packing list for three days of hiking with two nights in huts: waterproof jacket,
    fleece, two pairs of walking socks, spare T-shirt, trail mix, headlamp, first-aid kit,
    oatcakes, sun hat, water filter, map case, dried apricots, thermal leggings, egg
    sandwiches for the first day, blister plasters, lightweight gloves, penknife, instant
    noodles, hut sleeping bag liner, nut-free energy bars.
""")

_HARBOUR_POEM = code('''
    The boats come home with folded wings,
    the gulls complain of little things,
    and ropes that held the morning fast
    lie coiled and sleeping, work now past.

    The harbour lamps put on their gold,
    the water wrinkles, green and cold,
    and somewhere past the outer wall
    a bell rings once, and that is all.
''')

_HARBOUR_REVISED = code('''
    The boats come home with folded wings,
    the gulls complain of little things,
    and ropes that held the morning fast
    lie coiled and sleeping, work now past.

    The harbour lamps put on their gold,
    the water wrinkles, green and cold,
    and somewhere past the outer wall
    a bell rings once: who heard its call?
''')

_SIGNUPS_QUERY = code('''
    SELECT name, email, signed_up_at
    FROM members
    WHERE signed_up_at >= DATE '2025-03-01'
      AND signed_up_at < DATE '2025-04-01'
    ORDER BY signed_up_at;
''')

_BOOKING = code('''
    from dataclasses import dataclass, field
    from datetime import date


    @dataclass
    class RoomBooking:
        guest_name: str
        room_number: int
        check_in: date
        check_out: date
        guests: int = 1
        requests: list[str] = field(default_factory=list)
''')

_YAML = code('''
    server:
      host: 0.0.0.0
      port: 9000
      workers: 4
    logging:
      level: info
      file: /var/log/queue-worker.log
    queue:
      name: thumbnails
      max_retries: 5
      visibility_timeout_s: 120
''')

_MEETING_NOTES = prose("""
    Notes from the Tuesday planning call: Lena says the spring catalogue is two weeks behind
    because the photographer was ill. Marco can reshoot the garden furniture on Friday if the
    rain holds off. The printer needs final files by the 24th. Sam will ask the printer whether a
    one-week extension costs extra. Lena will send the revised shot list to Marco tonight.
    Budget is fine for now. Next call is Thursday at 10.
""")

_SUMMARY = prose("""
    The spring catalogue is two weeks behind schedule because the photographer was ill. Marco
    can reshoot the garden furniture on Friday, if it stays dry, and the printer needs the
    final files by the 24th. The budget is not a concern, and the team meets again on Thursday
    at 10.
""")

_CHECKLIST = code('''
    - [ ] Lena: send the revised shot list to Marco tonight
    - [ ] Marco: reshoot the garden furniture on Friday (if it stays dry)
    - [ ] Sam: ask the printer whether a one-week extension costs extra
    - [ ] Everyone: final files to the printer by the 24th
''')

_SPEECH = prose("""
    Good afternoon, everyone. We are here to say thank you to Priya, who is retiring after
    twenty-two years in accounts. In that time Priya has closed more than two hundred and fifty
    month-ends, trained half of the people in this room, and never once lost her patience with a
    late expense claim, although she came close. Priya, you made a difficult job look calm, and
    you made this office a kinder place. We will miss your spreadsheets, your lemon cake and your
    laugh. Please raise your glasses to Priya, and to a long and happy retirement.
""")

MULTI_TURN = {
    "multi_turn-01": (
        "Write a Python function that prints a Celsius to Fahrenheit conversion table.",
        f"Here is one:\n\n```python\n{_TABLE_CODE}```\n\nCall it as "
        "`print(conversion_table(-10, 40))`.",
        "Add a `step` parameter (default 1) so the table can go up in steps of 5 degrees, and "
        "show me the whole function again.",
    ),
    "multi_turn-02": (
        "I just adopted a tortoise. Can you suggest some names?",
        "Congratulations! A few ideas: Pebble, Sir Dawdle, Basil, Clementine, Atlas, Mossy, "
        "Professor Crumb and Juniper. Slow, dignified names tend to suit tortoises well.",
        "Thanks! Different question: what is the difference between baking soda and baking "
        "powder?",
    ),
    "multi_turn-03": (
        "Can you write an email to my landlord, Mr Okafor, saying the heating in flat 4 is "
        "broken? The boiler shows error E119.",
        _HEATING_EMAIL,
        "Make it a bit firmer and mention that this is the second time I have reported the "
        "problem this winter. Give me the whole email.",
    ),
    "multi_turn-04": (
        "What should I pack for three days of hut-to-hut hiking?",
        _PACKING,
        "Sort that list into three groups, clothing, food and gear, keeping every item exactly "
        "as you wrote it.",
    ),
    "multi_turn-05": (
        "What is a mortgage, in simple terms?",
        "A mortgage is a loan used to buy a home. The bank pays most of the price, and you pay "
        "it back in monthly instalments over many years, with interest. The home is the "
        "security for the loan: if you stop paying, the lender can sell it to get its money "
        "back.",
        "OK, thanks. What is a good way to learn touch typing as an adult?",
    ),
    "multi_turn-06": (
        "Write a short rhyming poem about a harbour at dusk.",
        _HARBOUR_POEM,
        "Change the last line so that the poem ends with a question.",
        _HARBOUR_REVISED,
        "Lovely. Now give me the whole poem again with a title above it.",
    ),
    "multi_turn-07": (
        "I have a table members(id, name, email, signed_up_at). Write a query that lists "
        "everyone who signed up in March 2025.",
        f"```sql\n{_SIGNUPS_QUERY}```",
        "Also leave out rows where email is NULL, and show me the full query again.",
    ),
    "multi_turn-08": (
        "My neck is stiff from sitting at a laptop all day. Any stretches?",
        "Try slow chin tucks: sit tall and draw your chin straight back, hold for five seconds, "
        "and repeat ten times. Then tilt one ear towards your shoulder, hold for twenty "
        "seconds, and swap sides. Raising your screen to eye level will help more than any "
        "stretch.",
        "Thank you. Can you suggest a simple vegetarian dinner for two that takes under "
        "thirty minutes?",
    ),
    "multi_turn-09": (
        "Translate into Spanish: 'The station is closed on Sundays.' 'Where can I buy a "
        "ticket?' 'The next bus leaves in ten minutes.'",
        "1. La estacion esta cerrada los domingos.\n2. Donde puedo comprar un billete?\n3. El "
        "proximo autobus sale en diez minutos.",
        "Now put the English and the Spanish side by side in a two-column Markdown table.",
    ),
    "multi_turn-10": (
        "Tell me a fun fact about octopuses.",
        "An octopus has three hearts: two pump blood through the gills and the third pumps it "
        "around the rest of the body. The third one actually stops beating while the octopus "
        "swims, which is one reason they prefer crawling.",
        "Ha. Now write a haiku about autumn rain.",
    ),
    "multi_turn-11": (
        "Write a Python dataclass for a hotel room booking.",
        f"```python\n{_BOOKING}```",
        "Add a `nights` property that returns the number of nights, and a `__post_init__` "
        "that raises ValueError unless check-out is after check-in. Show the whole module.",
    ),
    "multi_turn-12": (
        f"Summarise these notes:\n\n{_MEETING_NOTES}",
        _SUMMARY,
        "Turn the action items into a checklist with owners.",
        _CHECKLIST,
        "Now give me the summary and the checklist together, under the headings 'Summary' and "
        "'Actions', exactly as you wrote them.",
    ),
    "multi_turn-13": (
        "How do I get a red wine stain out of a wool carpet?",
        "Blot, do not rub: press a clean cloth onto the stain to lift as much wine as you can. "
        "Then dab on a mix of one tablespoon of washing-up liquid, one tablespoon of white "
        "vinegar and two cups of warm water, blot again, rinse with cold water and blot dry. "
        "Avoid hot water, which can set the stain in wool.",
        "Great, that worked. Unrelated: which is the tallest waterfall in the world?",
    ),
    "multi_turn-14": (
        "Write a short retirement speech for my colleague Priya, who has worked in accounts "
        "for twenty-two years. She is famous for her lemon cake.",
        _SPEECH,
        "Her name is actually spelt Preeya. Please give me the whole speech again with that "
        "fixed and nothing else changed.",
    ),
    "multi_turn-15": (
        "I am starting to learn Go. What should I read first?",
        "Start with the official Tour of Go, which runs in the browser and covers the syntax, "
        "slices, maps, methods, interfaces and goroutines in a few evenings. After that, "
        "'Effective Go' explains the idioms, and writing a small command-line tool will teach "
        "you the standard library faster than reading about it.",
        "And which editor would you recommend?",
        "Most people use VS Code with the official Go extension, or GoLand if you prefer a full "
        "IDE. Both run gopls, the Go language server, so completion and refactoring work the "
        "same way in either.",
        "Different topic: how many millilitres are in a US cup?",
    ),
    "multi_turn-16": (
        f"What does this config do?\n\n```yaml\n{_YAML}```",
        "It configures a background worker. The server listens on all interfaces on port 9000 "
        "with four worker processes; logs at level info go to /var/log/queue-worker.log; and "
        "the worker consumes the 'thumbnails' queue, retrying a failed job up to five times "
        "and hiding a job from other workers for 120 seconds while it is being processed.",
        "Convert that config to JSON, keeping every key and value.",
    ),
}
