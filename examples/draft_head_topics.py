"""Word lists for the draft head's prompt set (:mod:`examples.draft_head_prompts`), written for
this repository: who and what its prompts are about.

A *subject* pool (characters, situations, mechanisms, places, ...) is split between training and
held-out prompts; a *style* pool (:data:`STYLE_POOLS`: genres, forms, audiences, languages) is
shared. None of the benchmarks' prompts (``benchmarks/real_text/``, ``benchmarks/workloads.py``)
is about any entry: ``tests/examples/test_draft_head_prompts.py``.
"""

from __future__ import annotations

# the first prompt set's topics (family ``template``: ``draft_head_prompts.TASKS``)
TOPICS = [
    "the ocean", "volcanoes", "the moon landing", "chess", "bread baking",
    "electric cars", "the Roman Empire", "jazz music", "rain forests", "black holes",
    "recycling", "the human heart", "mountain climbing", "coffee", "origami", "trains",
    "the internet", "dinosaurs", "gardening", "the Olympic Games",
    "penguins", "solar panels", "ancient Egypt", "video games", "friendship", "libraries",
    "earthquakes", "the piano", "public transport", "cheese", "robots", "the Arctic",
    "birthdays", "sleep", "bicycles", "clouds", "the printing press", "time zones",
    "vaccines", "mathematics", "deserts", "kites", "museums", "teamwork",
    "chocolate", "airplanes", "sourdough", "owls", "the stock market", "football",
    "painting", "rivers", "the weather", "space stations", "farming", "languages", "maps",
    "tea", "hospitals", "bridges", "social media", "elephants",
    "climate change", "cooking pasta", "knitting", "astronomy", "taxes", "rock music",
    "the printing of money", "wolves", "running a marathon", "smartphones", "volunteering",
    "the Great Wall of China", "pirates", "fungi", "nuclear power", "poetry",
    "city parks", "ants", "the Renaissance", "cybersecurity", "camping", "the postal service",
    "whales", "wind turbines", "fashion", "the immune system", "carpentry",
    "glaciers", "opera", "electric guitars", "submarines", "spices", "rainbows", "democracy",
    "sailing", "architecture", "meditation", "the violin", "tigers", "deep sea fish",
]

CHARACTERS = [
    "a retired bus driver", "a young beekeeper", "a shy librarian's assistant", "a lonely robot",
    "a village baker", "a night nurse", "a travelling puppeteer", "a stone-collecting girl",
    "a boy unable to whistle", "an elderly tailor", "a nervous magician", "a clumsy cat",
    "a famous chef without a sense of taste", "a postman on his last round",
    "a stubborn goat", "a fox with a limp", "a mapmaker", "a young astronaut",
    "a tired school teacher", "a street musician", "a beekeeper's dog", "a forgetful wizard",
    "a detective afraid of the dark", "a drum-playing grandmother", "a baby dragon",
    "a museum guard", "a gardener with a secret", "a painter obsessed with the sea",
    "a shepherd", "a wandering knight", "a circus acrobat", "a bookshop owner",
    "a teenage inventor", "a cowboy afraid of horses", "a lonely giant",
    "a weather forecaster", "a cook on a fishing boat", "a young potter",
    "a fisherman's daughter", "a park ranger", "a talking parrot", "a jealous sister",
    "two brothers who never agree", "a ballet dancer with a broken toe", "a miner",
    "a new student at a strict boarding school", "a firefighter", "a taxi driver",
    "a theatre mouse", "a sleepy bear", "a scientist in Antarctica",
    "a retired spy", "a farmer's horse", "a young queen", "a poet who has run out of words",
    "a cleaner in a skyscraper", "a hospital porter", "a lost penguin", "a pirate cook",
    "an old fisherman", "a boy with a map from his attic", "a girl able to talk to trees",
    "a chess champion", "a beekeeper and her granddad", "a snail in a hurry", "a kind witch",
    "a school bus", "a zookeeper", "a deaf composer", "a trainee baker",
    "a pair of twins", "a city pigeon", "a stray dog", "a bride on her wedding morning",
    "a flower seller", "a carpenter", "a radio presenter", "a young monk",
    "an ambitious ant", "an owl unable to sleep at night", "a newspaper boy",
    "a violin repairer", "a marathon runner with a sore knee", "a tiny elephant",
    "a train conductor", "a reluctant hero", "a lonely scarecrow", "a pastry chef",
    "a tour guide in Rome", "an explorer in the jungle", "a beetle", "a mountain guide",
    "a seamstress", "a dentist", "an old soldier", "a clever rabbit", "a frog prince",
    "a grumpy cat", "a young pilot", "a deep-sea diver", "a wildlife photographer",
    "a bored teenager", "a chimney sweep", "a family of mice", "a rescue dog", "a beach lifeguard",
]

SITUATIONS = [
    "finds a door that was not there yesterday", "has to deliver a parcel across a flooded city",
    "loses their voice the day before a big performance", "wins a prize by mistake",
    "discovers that their shadow has a mind of its own", "gets stuck in a lift with a stranger",
    "tries to cook a feast for a hundred guests", "befriends a creature nobody else can see",
    "must keep a promise made twenty years ago", "finds a stranger's diary on a train",
    "wakes up speaking a language they never learned", "is invited to a party on the moon",
    "has to choose between two best friends", "plants a seed that grows overnight",
    "tries to break a world record", "gets lost in a snowstorm", "trains for a race",
    "opens a shop that sells forgotten things", "receives a letter from their future self",
    "is the only one who remembers yesterday", "follows a trail of paper birds",
    "swaps places with their pet for a day", "hears music coming from an empty house",
    "finds a key with no lock", "has to climb the tallest tree in the forest",
    "returns home after thirty years away", "hides a secret talent", "learns to swim",
    "organises a surprise for an old friend", "goes on a journey to find the end of a rainbow",
    "is asked to judge a cake competition", "has one day to save the village library",
    "adopts a very unusual pet", "tries to make the king laugh", "finds a message in the snow",
    "builds a boat out of old doors", "has to spend a night alone in a museum",
    "is given a magic paintbrush", "races against a storm to bring in the harvest",
    "starts a band with the children next door", "finds an egg that is far too big",
    "teaches an old dog a new trick", "is stranded on an island with a cook",
    "tries to catch the thief who steals socks", "discovers a garden on a rooftop",
    "must guide a herd of sheep over a mountain", "becomes invisible every Tuesday",
    "is chosen to carry the flag at a festival", "finds a tiny village under the floorboards",
    "writes a song for someone they have never met", "gets a job at a haunted theatre",
    "tries to stay awake to see a shooting star", "loses a bet and has to wear a costume",
    "rescues a kite from a tall tower", "has to sell their favourite possession",
    "discovers a cave full of paintings", "is followed home by a cloud",
    "wakes up one morning taller than a house", "sees a whale from a small boat",
    "must cross a desert with only one bottle of water", "is asked to keep a dragon's egg warm",
    "tries to win back a lost friendship", "accidentally starts a parade",
    "finds an old photograph of themselves in a stranger's house", "mends a broken bridge",
    "hears a knock on the door at midnight", "is given a second chance at a lost dream",
    "runs a tiny restaurant for animals", "counts the stars for a living",
]

SETTINGS = [
    "a mountain village", "a space station orbiting Jupiter", "a night train across the desert",
    "a busy street market", "an island with one tree", "a city built on stilts",
    "a farm at the edge of the world", "an underground city", "a boarding school in the hills",
    "a bakery at four in the morning", "a circus in winter", "a village in the rainforest",
    "a castle by the sea", "a small town in the 1950s", "a floating city in the clouds",
    "a research ship in the Arctic", "an abandoned amusement park", "a royal kitchen",
    "a forest where it never stops raining", "a tiny flat above a noisy cafe", "a desert oasis",
    "a hospital during a storm", "a futuristic city where cars fly", "a medieval fair",
    "a fishing village in Norway", "a palace garden", "a bus stuck in traffic",
    "an ancient Greek market", "a Victorian London street", "a tea plantation in India",
    "a hidden valley in the mountains", "a small theatre on opening night",
]

GENRES = [
    "mystery", "science-fiction", "fantasy", "funny", "adventure", "heart-warming",
    "historical", "fairy-tale", "detective", "gently spooky", "romantic", "bittersweet",
    "myth-like", "slice-of-life",
]

FORMS = [
    "a series of diary entries", "letters between two friends", "a series of text messages",
    "a radio news report", "a folk tale", "a monologue", "a list of instructions",
    "a series of postcards", "an interview", "a campfire tale",
]

OPENINGS = [
    "The last bus of the night was empty except for a man holding a goldfish bowl.",
    "Nobody in the village had ever seen snow in July.",
    "On the morning of her tenth birthday, Mira found a small green door in the garden wall.",
    "The robot had been switched off for a hundred years when the children found it.",
    "It was the kind of rain that makes even the pigeons stay at home.",
    "My grandfather kept a suitcase under his bed that nobody was allowed to open.",
    "The ship's bell rang three times, though nobody was near it.",
    "Tom had exactly one hour to find a birthday present, and he had no money.",
    "The town's only bakery closed on a Monday, and by Tuesday everyone was worried.",
    "The old map had an island drawn on it that did not appear on any other map.",
    "When the music stopped, the dancers froze, and so did the lights in the hall.",
    "Every night at nine, the house across the road lit up in a different colour.",
    "The parcel was addressed to someone who had died two hundred years ago.",
    "The dog came back from its walk carrying a golden key.",
    "It was the first day of summer, and the river had turned completely silver.",
    "Nobody noticed the new girl until she started singing in the canteen.",
    "The spaceship landed in the school playground during the maths lesson.",
    "Grandma said the garden gnome moved at night, and nobody believed her.",
    "The storm knocked out the power just as the final question was asked.",
    "He had been climbing the mountain for three days when he met the woman with the kettle.",
]

OBJECTS = [
    "an old pair of boots", "a teapot", "a library book", "a paper kite", "a wedding ring",
    "a piano in a school hall", "a lost glove", "a streetlamp", "a kitchen knife",
    "a football", "a bicycle left in the rain", "a snow globe", "a teddy bear",
    "a coin in a fountain", "a mirror in an old house", "a suitcase", "a blunt pencil",
    "a bridge over a river", "a tree in a city park", "a violin in a shop window",
]

ANIMALS = [
    "a fox", "a badger", "an owl", "a rabbit", "a goat", "a lion", "a mouse", "a bear",
    "a heron", "a frog", "a donkey", "a wolf", "a squirrel", "a magpie", "a camel",
    "a beaver", "an otter", "a spider", "a goose", "a peacock", "a mole", "a lamb",
]

POEM_SUBJECTS = [
    "a city at night", "the smell of bread", "an empty playground", "a grandmother's hands",
    "the sound of a train far away", "a summer thunderstorm", "a garden in spring",
    "friendship", "homesickness", "the first day at a new school", "the desert at noon",
    "a cup of tea", "a lost dog", "the sea in winter", "a busy kitchen", "old photographs",
    "a bicycle ride", "the stars over the mountains", "a sleeping cat", "a market morning",
    "waiting for a letter", "a river in flood", "a long journey home", "the end of summer",
]

MECHANISMS = [
    "a bicycle's gears", "a hydraulic jack", "a thermostat", "a solar panel", "a wind turbine",
    "an electric motor", "a steam engine", "a car's brakes", "a touch screen", "a camera lens",
    "a toilet cistern", "a passenger lift", "a parachute", "a hot water bottle", "a vaccine",
    "a battery", "a smoke detector", "an electric kettle", "a barcode scanner",
    "a credit card payment", "a search engine", "a fuel cell", "a jet engine",
    "a 3D printer", "a pressure cooker", "a charcoal water filter", "an X-ray machine",
    "a heart pacemaker", "a vending machine", "a dishwasher", "a loudspeaker",
    "a mechanical watch", "an escalator", "a compass", "a pendulum", "a sewing machine",
    "a lawn mower", "a traffic roundabout", "a ship lift", "a submarine's ballast tanks",
    "a helicopter rotor", "a spam filter", "a password manager", "a video call",
    "a tidal power station", "a hearing aid", "a blood pressure monitor", "an induction hob",
    "an electric toothbrush", "a sailing boat against the wind", "a piano's hammers",
    "a printing press", "a water tower", "a dam", "a contact lens", "a light bulb",
    "a recycling plant", "a wastewater treatment plant", "a spreadsheet formula",
    "an e-reader screen", "a bar of chocolate being made", "a car's airbag",
]

PHENOMENA = [
    "do cats purr", "does bread go stale", "do we get hiccups", "is the sea salty",
    "do onions make people cry", "do we yawn", "does popcorn pop", "do birds fly in a V shape",
    "do we dream", "does metal feel colder than wood", "do stars twinkle",
    "do some people get seasick", "does a bicycle stay upright", "do bubbles look rainbow-coloured",
    "do cats land on their feet", "does the wind blow", "do we have fingerprints",
    "does hair turn grey", "does chocolate melt in your mouth", "do some people snore",
    "do dogs wag their tails", "does a rainbow form", "do mosquitoes bite some people more",
    "do boats float", "do we get goosebumps", "do apples turn brown after being cut",
    "does thunder follow lightning", "do planes leave white trails", "do cheeses smell",
    "do some animals hibernate", "does a spinning top stay up", "do eyes get tired",
    "do tides rise and fall", "do we need sleep", "does music give people chills",
    "does yeast make dough rise", "do deserts get cold at night", "is honey so long-lasting",
    "do bees dance", "do camels have humps", "do zebras have stripes", "does rust form",
    "do we blush", "do some trees live for thousands of years", "do glaciers move",
    "do volcanoes erupt", "do fireflies glow", "do we sneeze", "does salt melt ice on roads",
    "do people have different blood types",
]

CONCEPTS = [
    "supply and demand", "opportunity cost", "how a law is passed", "binary numbers",
    "entropy", "the scientific method", "natural selection", "gravity", "democracy",
    "a household plan for spending", "the water cycle", "electric current", "an ecosystem",
    "probability",
    "the greenhouse effect", "a stock market index", "encryption", "a neural network",
    "an election", "how insurance works", "the food chain", "plate tectonics", "evolution",
    "supply chains", "how a bank makes money", "the placebo effect", "vitamins",
    "the difference between speed and velocity", "fractions", "percentages", "taxes",
    "how the heart pumps blood", "the immune system", "atoms", "magnetism", "friction",
    "a contract", "copyright", "version control", "how the internet sends data",
    "cloud computing", "an operating system", "a database", "a spreadsheet",
    "how memory works in the brain", "sleep cycles", "metabolism", "erosion",
    "the seasons", "time zones", "the stock exchange", "a trade deficit", "renewable energy",
    "carbon footprints", "the rule of law", "a pension", "a credit score", "irony",
    "a metaphor", "the passive voice", "photographic exposure", "musical harmony",
]

AUDIENCES = [
    "a ten-year-old", "a curious grandparent", "a new employee", "a high-school student",
    "someone who has never studied science", "a busy manager, in five sentences",
    "a university student", "a friend over coffee", "a seven-year-old",
    "someone learning English",
]

PAIRS = [
    "weather and climate", "a lake and a pond", "a crocodile and an alligator",
    "a simile and a metaphor", "a democracy and a republic", "an ape and a monkey",
    "a fruit and a vegetable", "a hurricane and a tornado", "a sea and an ocean",
    "a town and a city", "a debit card and a credit card", "a violin and a viola",
    "a rabbit and a hare", "speed and acceleration", "a novel and a novella",
    "a frog and a toad", "a cold and the flu", "a moth and a butterfly", "baking and roasting",
    "a hill and a mountain", "a dolphin and a porpoise", "a river and a stream",
    "a poem and a song", "weight and mass", "a fact and an opinion", "an app and a website",
    "a loan and a grant", "a tortilla and a pancake", "a bog and a swamp",
    "an emigrant and an immigrant", "a psychologist and a psychiatrist", "a compiler and an "
    "interpreter", "RAM and storage", "a meteor and a meteorite", "an idiom and a proverb",
    "a jury and a judge", "a cello and a double bass", "a rainforest and a cloud forest",
]

PROCESSES = [
    "cheese is made", "paper is made from trees", "a letter travels from sender to receiver",
    "glass is made", "chocolate is made from cocoa beans", "a bill is paid by bank transfer",
    "a newspaper is printed", "a house is built", "a film is made", "wine is made",
    "a bridge is designed", "coffee gets from the farm to the cup", "a vaccine is developed",
    "a book is published", "a cotton T-shirt is made", "a road is built", "a tunnel is dug",
    "a web page loads in a browser", "bread rises and bakes", "olive oil is made",
    "a cut on the skin heals", "rain forms", "a seed becomes a plant", "a caterpillar "
    "becomes a butterfly", "a volcano forms", "a mountain range forms", "a star is born",
    "soil is formed", "a cave is formed", "tea is processed",
]

ISSUES = [
    "school uniforms", "working four days a week", "banning cars from city centres",
    "homework for young children", "zoos", "social media for teenagers", "space exploration",
    "nuclear power", "online shopping", "learning Latin at school", "self-driving cars",
    "a universal basic income", "plastic bags", "remote work", "video games for children",
    "tourism in small towns", "tipping in restaurants", "daylight saving time",
    "open-plan offices", "keeping pets in flats", "electric scooters", "school exams",
    "a shorter summer holiday", "mobile phones in classrooms",
    "a ban on fireworks", "free public transport", "longer school days", "compulsory voting",
    "fast fashion", "lowering the voting age to sixteen", "shops that refuse cash",
    "reality television", "the salaries of professional athletes", "city bike-sharing schemes",
    "artificial intelligence in schools", "banning adverts for junk food",
    "wild animals in circuses", "paying students for good grades", "cruise ships",
    "building more airports", "allowing dogs in restaurants", "a car-free Sunday each month",
    "military service", "celebrities in politics", "e-books replacing printed books",
    "smart speakers at home", "esports at the Olympics", "uniforms for office workers",
    "school gardens", "a tax on sugary drinks",
]

PLACES = [
    "Iceland", "Kyoto", "the Amazon river", "Venice", "the Sahara", "Patagonia", "Istanbul",
    "Mongolia", "Madagascar", "the Galapagos Islands", "Petra", "Machu Picchu", "Lapland",
    "Marrakech", "Greenland", "the Dead Sea", "Bhutan", "Cappadocia", "Zanzibar",
    "the Scottish Highlands", "Tasmania", "Lake Baikal", "Angkor Wat", "Cuba", "Nepal",
    "Prague", "the Atacama Desert", "Yellowstone", "the Faroe Islands", "Namibia",
    "Budapest", "the Black Forest", "Quebec", "Sri Lanka", "Vietnam", "Peru", "Portugal",
    "Finland", "Chile", "Kenya", "Morocco", "Jordan", "Croatia", "Vancouver", "Singapore",
    "Edinburgh", "Seville", "Oaxaca", "Hokkaido", "the Norwegian fjords",
]

PEOPLE = [
    "Marie Curie", "Leonardo da Vinci", "Nelson Mandela", "Isaac Newton", "Cleopatra",
    "Wolfgang Amadeus Mozart", "Frida Kahlo", "Galileo Galilei", "Florence Nightingale",
    "Charles Darwin", "Genghis Khan", "Jane Austen", "Albert Einstein", "Rosa Parks",
    "Nikola Tesla", "William Shakespeare", "Confucius", "Queen Victoria", "Mahatma Gandhi",
    "Amelia Earhart", "Ludwig van Beethoven", "Julius Caesar", "Harriet Tubman",
    "Alan Turing", "Marco Polo", "Vincent van Gogh", "Hypatia", "Johannes Gutenberg",
    "Ibn Battuta", "Katherine Johnson", "Louis Pasteur", "Joan of Arc", "Pablo Picasso",
    "Rachel Carson", "Grace Hopper", "Alexander the Great", "Sojourner Truth",
    "Dmitri Mendeleev", "Ernest Shackleton", "Hokusai",
]

EVENTS = [
    "the fall of the Berlin Wall", "the first flight of the Wright brothers",
    "the invention of the telephone", "the building of the pyramids of Giza",
    "the first Olympic Games of modern times", "the eruption of Vesuvius in 79 AD",
    "the discovery of penicillin", "the signing of the Magna Carta", "the Industrial Revolution",
    "the first ascent of Everest", "the opening of the Suez Canal", "the Black Death",
    "the invention of the World Wide Web", "the Apollo 13 mission", "the Gold Rush in "
    "California", "the voyage of the Mayflower", "the first vaccine against smallpox",
    "the building of the Panama Canal", "the sinking of the Titanic", "the Silk Road trade",
]

CREATURES = [
    "the blue whale", "the giraffe", "the snow leopard", "the axolotl", "the platypus",
    "the hummingbird", "the koala", "the red panda", "the emperor penguin", "the cheetah",
    "the sea otter", "the monarch butterfly", "the chameleon", "the orangutan", "the kiwi bird",
    "the narwhal", "the mantis shrimp", "the barn owl", "the polar bear", "the sloth",
    "the pangolin", "the flamingo", "the Komodo dragon", "the jellyfish", "the beaver",
    "the meerkat", "the albatross", "the gorilla", "the seahorse", "the armadillo",
    "the wolverine", "the tapir", "the manatee", "the tenrec",
]

QUESTIONS = [
    "How many planets are in the solar system, and which is the largest?",
    "What is the tallest building in the world?", "How far away is the sun from the earth?",
    "What language has the most native speakers?", "How many teeth does an adult have?",
    "Which ocean is the largest?", "What is the smallest country in the world?",
    "How long does it take light from the sun to reach us?", "Who invented the light bulb?",
    "What are the three primary colours of light?", "How many strings does a guitar have?",
    "Which planet has the most moons?", "What is the hardest natural substance?",
    "Which desert is the largest in the world?", "How many players are in a rugby union team?",
    "What is the most spoken language in South America?", "How old is the universe?",
    "Why is Pluto no longer called a planet?", "What is the freezing point of sea water?",
    "What is the population of the world, roughly?", "How many hearts does an earthworm have?",
    "Which country has the most islands?", "What is the longest river in Europe?",
    "What does a geologist study?", "When was the first computer built?",
    "What is the currency of Japan?", "How many keys does a standard piano have?",
    "Which gas makes up most of the air we breathe?", "How big is the Pacific Ocean?",
    "Which animal is the fastest on land?", "How many time zones does Russia have?",
    "What is the main ingredient of guacamole?", "How fast does the earth spin?",
    "What is a light year?", "Which metal is the best conductor of electricity?",
    "How many lines does a sonnet have?", "What is the largest moon of Saturn?",
    "Who painted the ceiling of the Sistine Chapel?", "What is the smallest bird?",
    "How much of the earth's surface is covered by water?", "What is a prime number?",
    "Which continent has the most countries?", "How many chambers does the heart have?",
    "Why do we have leap seconds?", "What are the official languages of Switzerland?",
    "What is the most common element in the universe?", "How long is a marathon?",
    "Which country invented paper?", "What is the deepest lake in the world?",
    "How many colours are in a rainbow, and what are they?", "What is a haiku?",
    "Which is the oldest university still in use?", "What causes a solar eclipse?",
    "How many legs does a spider have, and how many does an insect have?",
    "What is the largest animal that has ever lived?", "What is the capital of Canada?",
    "How hot is the surface of the sun?", "What is the official language of Brazil?",
    "Which vitamin do we get from sunlight?", "What is the difference between a bay and a gulf?",
    "Who was the first person in space?", "Which instrument has 47 strings?",
    "How much does a litre of water weigh?", "What is an isthmus?",
    "How many sides does a hexagon have, and where are hexagons found in nature?",
    "What is the largest desert in Asia?", "What is the largest city in Africa?",
    "How many countries are in the European Union?", "What is the national animal of Scotland?",
    "How long can a camel go without water?", "What is the rarest blood type?",
]

ACTIVITIES = [
    "swimming", "learning the guitar", "painting with watercolours", "rock climbing",
    "photography", "baking bread at home", "learning Japanese", "yoga", "chess", "knitting",
    "bird watching", "writing a novel", "learning to code", "cycling to work",
    "growing vegetables on a balcony", "playing tennis", "public speaking", "meditation",
    "ice skating", "learning to draw", "keeping chickens", "woodworking", "camping",
    "surfing", "learning the piano", "journaling", "cooking for the week ahead",
    "dancing salsa", "volunteering", "weight training", "pottery", "sewing clothes",
    "scuba diving", "stand-up comedy", "podcasting", "kayaking",
    "archery", "mountain biking", "learning sign language", "bouldering", "orienteering",
    "sketching outdoors", "playing the ukulele", "calligraphy", "making candles", "fencing",
    "composting", "film photography", "table tennis", "learning Italian",
    "cross-country skiing", "juggling", "making jam", "learning to play the drums",
    "restoring old furniture", "tracking the stars with a telescope",
]

LIFE_SITUATIONS = [
    "moving to a new city where I know nobody", "asking for a pay rise",
    "my first week in a new job", "saving money for a holiday", "preparing for an exam",
    "sharing a flat with friends", "talking to a friend who is sad", "going back to study at 40",
    "saying no to extra work", "planning a wedding on a small budget",
    "keeping in touch with family abroad", "learning to live with less clutter",
    "getting a teenager to help at home", "sleeping better", "making friends as an adult",
    "giving a presentation when I am nervous", "choosing a first car", "a long flight",
    "starting a small business", "writing a good CV", "a job interview next week",
    "looking after a new puppy", "staying healthy during winter", "planning a road trip",
    "eating less sugar", "becoming a parent for the first time", "leading a team meeting",
    "buying a second-hand bicycle", "drinking more water", "spending less time on my phone",
    "my first month at university", "moving back in with my parents",
    "caring for an elderly parent", "working night shifts", "a noisy neighbour",
    "losing touch with an old friend", "learning to drive at thirty",
    "planning a child's birthday party", "being the new person in a sports team",
    "dealing with a rude customer", "my first time living alone", "cooking for a fussy eater",
    "preparing for a long bike tour", "choosing a university course",
    "giving a speech at a friend's wedding", "keeping houseplants alive",
    "a group project where nobody helps", "deciding whether to change careers",
    "getting back into exercise after an injury", "studying while working full time",
]

RECIPIENTS = [
    "your manager", "a neighbour", "a former teacher", "your sister", "a seaside hotel",
    "a customer", "the head of your child's school", "an old friend", "a new colleague",
    "your local council", "a bookshop", "your grandmother", "a sports club", "an important client",
    "a company that sent the wrong order", "your team", "a museum", "a train company",
]

PURPOSES = [
    "asking for a day off next Friday", "thanking them for a birthday present",
    "inviting them to a garden party", "apologising for missing a meeting",
    "asking for a refund", "congratulating them on a new baby", "introducing yourself",
    "asking for advice about a career change", "complaining about a late delivery",
    "sharing news about a move abroad", "asking to reschedule an appointment",
    "suggesting a new idea for the office", "saying goodbye before leaving the company",
    "asking them to sponsor a charity walk", "confirming the details of a booking",
    "reminding them of an unpaid invoice", "recommending a book", "asking for a reference",
    "organising a reunion", "reporting a noisy party", "welcoming them to the team",
    "thanking them for their help during a hard time", "asking about a lost property item",
    "proposing a weekly book club",
]

JOBS = [
    "a school librarian", "a park ranger", "an air traffic controller", "a nurse", "a chef",
    "a primary school teacher", "a software developer", "a vet", "a dentist", "a farmer",
    "a journalist", "an airline pilot", "a carpenter", "a museum curator", "a translator",
    "a baker", "a firefighter",
    "a marine biologist", "an architect", "a shop assistant", "a gardener", "an electrician",
    "a tour guide", "a bus driver", "a midwife", "a data analyst", "a barista",
]

SCENES = [
    "a railway station at rush hour", "a beach on a stormy day", "a kitchen on a holiday",
    "a forest after rain", "a busy hospital corridor", "a school playground at break time",
    "a football stadium before a final", "a city rooftop at sunrise", "a quiet library",
    "a fish market at dawn", "an airport at midnight", "a village fete",
    "a snowy mountain hut", "a crowded summer festival", "a bakery in the early morning",
    "a classroom on the last day of term", "a farmyard in spring", "a subway carriage",
    "a desert road", "an old attic", "a garden centre on a Sunday", "a concert hall",
    "a night bus across town", "a rainy Monday in an office",
    "a swimming pool on the first hot day", "a wedding reception", "a flower market",
    "a building site at lunchtime", "a quiet church", "a mountain lake at dawn",
    "a jazz club late at night", "a second-hand bookshop", "a bus depot in winter",
    "a tennis court in summer", "a hospital garden", "a cinema before the film starts",
    "a village square on market day",
]

PRODUCTS = [
    "a waterproof backpack", "a reusable coffee cup", "a smart alarm clock",
    "a folding bicycle", "a children's microscope", "a handmade wooden chess set",
    "a solar-powered lantern", "a set of kitchen knives", "a desk lamp", "a rain jacket",
    "a board for chopping vegetables", "a pair of running shoes", "a travel pillow",
    "a plant pot that waters itself", "a notebook made from recycled paper",
    "a pair of wireless earbuds", "a dog bed", "a camping stove", "a wooden toy train",
    "a ceramic teapot",
    "a bird feeder", "a picnic blanket", "an electric bicycle", "a children's raincoat",
    "a set of paintbrushes", "a cast-iron pan", "a yoga mat", "a bamboo toothbrush",
    "a desk organiser", "a cooking thermometer",
]

LANGUAGES = ["Python", "JavaScript", "Java", "C++", "Go", "Rust", "TypeScript", "Ruby",
             "Kotlin", "C#"]

CODE_TASKS = [
    "returns the second largest number in a list", "counts the vowels in a string",
    "returns the number of days between two dates", "converts Roman numerals "
    "to integers", "removes duplicate entries from a list while keeping their order",
    "checks whether two strings are anagrams", "computes the greatest common divisor of two "
    "numbers", "returns the most common element of a list", "capitalises the first letter of "
    "every word in a sentence", "computes the median of a list of numbers",
    "transposes a matrix given as a list of lists", "converts a number of seconds into hours, "
    "minutes and seconds", "validates an email address in a simple way", "rotates a list by k "
    "positions", "finds all pairs of numbers in a list that add up to a target",
    "turns a list of words into a dictionary of word lengths", "checks whether brackets in a "
    "string are balanced", "computes the factorial of a number with a loop",
    "draws a text triangle of stars of a given height", "computes the average grade for each "
    "student from a dictionary of lists", "returns the longest word in a sentence",
    "converts kilometres to miles and back", "shuffles a deck of cards",
    "finds the missing number in a list of 1 to n", "sums the digits of an integer",
    "checks whether a number is a perfect square", "generates a random password of a given "
    "length", "compresses a string like 'aaabb' into 'a3b2'", "merges two sorted lists into "
    "one sorted list", "returns the intersection of two lists", "counts the lines, words and "
    "characters in a text file", "computes the area of a circle, a square or a triangle",
    "implements a simple stack with push, pop and peek", "implements a queue using two stacks",
    "does a binary search on a sorted list", "sorts a list of dictionaries by one key",
    "converts a hexadecimal colour code to RGB values", "checks whether a sentence is a "
    "pangram", "builds row n of Pascal's triangle", "simulates rolling two dice a "
    "thousand times and counts the totals", "finds the first non-repeating character in a "
    "string", "converts a snake_case name to camelCase", "computes simple interest",
    "groups words by their first letter", "returns the day of the week for a date",
    "implements bubble sort", "reverses the order of words in a sentence",
    "counts how many times each letter appears in a string", "checks whether a number is an "
    "Armstrong number", "formats a phone number as (123) 456-7890",
]

SQL_TASKS = [
    "lists the five most expensive products in a table products(id, name, price)",
    "counts the orders per customer in a table orders(id, customer_id, created_at)",
    "finds the customers who have never placed an order, given customers and orders tables",
    "returns the average rating of each film in a table reviews(film_id, rating)",
    "lists the books published after 2000 from a table books(id, title, year, author)",
    "deletes rows older than 30 days from a table logs(id, message, created_at)",
    "creates a table for library loans with a primary key and two foreign keys",
    "returns the total sales per month from a table sales(id, amount, sold_at)",
]

SHELL_TASKS = [
    "counts the files in a directory and its subdirectories",
    "renames every .txt file in a folder to .md", "backs up a folder into a dated zip file",
    "prints the lines of a log file that contain the word ERROR",
    "shows how much disk space each user's home directory uses",
    "checks whether each host listed in a file answers a ping",
]

STYLE_POOLS = frozenset({"genre", "form", "audience", "language"})
