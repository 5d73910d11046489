"""What the demo is made of, for either generation (make_demo.py trains on it; nothing here imports the
reference): the smart-home app's rows, and the pre-training corpus of made-up tools over common words.

    python3 examples/demo/corpus.py   # writes smart_home.jsonl and smart_home.suite.json, with any python3
                                      # (make_demo.py writes the dataset too)

The app (smart_home.jsonl, 302 rows) is one app's: five tools in one tools prompt, as an app sends them
with every request, every closed set an enum and every number bounded (the rooms, the doors, 10-30 degrees,
brightness 0-100, timers of 1-180 minutes); its users' own phrasings ("Make the kitchen 19.5 degrees
please", "Put on some Nina Simone"), arguments left out when the user does not say them, and rows that
teach restraint, answered with no call: a required value not said ("Turn on the lights"), a request the user
says not to do ("Do not lock the side door"), a value outside a tool's set or bounds ("Heat the bedroom to 45"),
a request no tool serves ("Unlock the back door") or a question; and two requests at once, two calls. No row
repeats another's words, and every tool is called in at least MIN_CALLS rows, so the file passes the dataset
doctor (`needle data`). corpus.py also writes smart_home.suite.json, the app's acceptance suite for `needle
suite`: 32 cases written by hand in cactus-needle 3.x's six categories and proportions, nine critical, no
query the dataset holds.

The corpus holds made-up tools over common words (1 to 5 a row; some parameter names decorated, such as
"home_city"), queries that either name each argument ("city Paris, days 3") or say it as people do ("Book
a hotel in Paris for 3 days", the tool's verb sometimes left out), and questions that need no call. The
words are common ones (rooms, people's and artists' names, minutes, degrees), each seen in queries and
copied into calls, as any base model has seen them; the app's five tools and its users' phrasings are not
in it.
"""
import json
import os
import random
import re
from collections import Counter

DATASET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smart_home.jsonl")
SEED = 5

# The dataset doctor's least number of calls per tool (needle-engine's doctor::MIN_CALLS_PER_TOOL).
MIN_CALLS = 10


def schema(name, description, properties, required):
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}


# --------------------------------------------------------------------------------------------
# Pre-training corpus: made-up tools over common words, queries that name or say their arguments
# --------------------------------------------------------------------------------------------
# A base model has read plenty of English: the words below (household things, places, people's and
# artists' names, foods) are common ones, each seen both in a query and copied into a call, so the
# tokenizer keeps them whole and pre-training trains their embeddings. What the base never sees is
# the smart-home app itself: its five tools and its users' phrasings.

VERBS = ["get", "find", "send", "create", "cancel", "check", "update", "order", "track", "book",
         "add", "remove", "schedule", "share", "search", "open", "close", "start", "stop", "set",
         "show", "list", "delete", "rename", "move", "copy", "pay", "rate", "report", "translate",
         "convert", "count", "record", "upload", "download", "print", "scan", "reserve", "renew", "mute",
         "play", "pause", "lock", "unlock", "dim", "heat", "cool", "clean", "feed", "charge", "call",
         "watch", "turn_on", "turn_off", "switch_on", "switch_off", "look_up", "sign_in", "wake_up", "water"]
NOUNS = ["weather", "alarm", "flight", "email", "song", "pizza", "package", "movie", "meeting",
         "note", "reminder", "invoice", "ticket", "playlist", "contact", "photo", "file", "task",
         "event", "order", "account", "route", "hotel", "recipe", "podcast", "budget", "expense",
         "workout", "message", "document", "calendar", "subscription", "review", "parcel", "table",
         "car", "taxi", "train", "book", "album", "video", "channel", "folder", "backup", "device",
         "printer", "lamp", "fan", "heater", "garden", "pet", "doctor", "appointment", "lesson",
         "lights", "thermostat", "timer", "music", "door", "window", "oven", "kettle", "blinds", "speaker",
         "radio", "camera", "sprinkler", "vacuum", "fridge", "washer", "radiator", "doorbell", "garage",
         "stopwatch", "countdown", "heating", "radio", "news", "story", "game", "gate", "curtains"]
ROOMS_SEEN = ["kitchen", "bedroom", "living room", "office", "bathroom", "hallway", "nursery", "garage",
              "attic", "basement", "patio", "porch", "study", "dining room", "guest room", "laundry room"]
PEOPLE = ["Nina Simone", "Miles Davis", "Daft Punk", "Adele", "Bach", "Fleetwood Mac", "Bob Marley",
          "Radiohead", "Beyonce", "Coldplay", "Queen", "Norah Jones", "Taylor Swift", "Ed Sheeran", "Mozart",
          "The Beatles", "Billie Eilish", "Drake", "Louis Armstrong", "Ella Fitzgerald", "Elton John", "Shakira",
          "Anna", "Marco", "Priya", "Kenji", "Sofia", "Omar", "Lena", "Diego", "Mia", "Tom", "Grace Lee",
          "Sam Jones", "Maria Garcia", "David Kim", "Emma Brown", "Noah Smith"]
WORDS = ["Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Boston", "Madrid", "Seoul", "Quito",
         "blue", "green", "red", "small", "large", "morning", "evening", "weekly", "daily", "urgent",
         "jazz", "rock", "pasta", "coffee", "report", "budget", "summer", "winter", "project", "family",
         "work", "school", "gym", "home", "Tuesday", "Friday", "March", "June", "noon", "midnight", "spicy",
         "vegan", "economy", "first", "tea", "eggs", "bread", "laundry", "homework", "nap", "rice", "soup",
         "cake", "cookies", "pizza", "front", "back", "side", "main", "upstairs", "downstairs", "window seat",
         "dinner", "lunch", "breakfast", "yoga", "meditation", "stretching", "chess", "piano", "guitar"]
PHRASES = ["buy milk", "call the bank", "water the plants", "pick up the kids", "team standup",
           "dentist visit", "quarterly review", "birthday party", "good morning", "see you soon"]


def random_value(rng, kind, plain):
    if kind == "integer":
        return rng.choice([rng.randint(1, 12), rng.randint(10, 99), rng.randint(100, 2000)])
    if kind == "number":
        return rng.choice([round(rng.uniform(0.5, 99), 1), round(rng.uniform(1, 500), 2),
                           float(rng.randint(1, 40)) + 0.5, rng.randint(1, 40)])
    if kind == "boolean":
        return rng.random() < 0.5
    if plain in ("location", "place", "area"):
        return rng.choice(ROOMS_SEEN)
    if plain == "room":
        return rng.choice(ROOMS_SEEN)
    if plain in ("performer", "band", "person", "recipient", "user", "guest", "artist"):
        return rng.choice(PEOPLE)
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(PHRASES)
    if roll < 0.3:
        return rng.choice(ROOMS_SEEN + PEOPLE)
    if roll < 0.4:
        return f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
    return rng.choice(WORDS)


# How people mention each argument when they do not name it: "{}" is where the value goes. Common
# names (room, minutes, artist) are among them, as in any app's tools.
CARRIERS = {
    "room": ["in the {}", "for the {}"], "minutes": ["for {} minutes", "in {} minutes"], "label": ["labelled {}"],
    "brightness": ["at brightness {}"], "celsius": ["at {} celsius"], "artist": ["by {}"], "door": ["through the {} door"],
    "city": ["in {}", "for {}"], "destination": ["to {}"], "origin": ["from {}"], "location": ["at the {}", "in the {}"],
    "place": ["in the {}", "at the {}"], "area": ["in the {}", "for the {}"],
    "date": ["on {}"], "time": ["at {}"], "name": ["called {}", "named {}"], "title": ["titled {}", "called {}"],
    "query": ["for {}", "about {}"], "text": ["saying {}", "that says {}"], "note": ["with the note {}"],
    "subject": ["about {}"], "color": ["in {}"], "size": ["size {}"], "user": ["for {}"], "recipient": ["to {}"],
    "performer": ["by {}", "from {}"], "band": ["by {}"], "person": ["with {}", "for {}"], "guest": ["for {}"],
    "language": ["in {}"], "genre": ["{} style"], "category": ["under {}"], "channel": ["on {}"],
    "device": ["on the {}"], "mode": ["in {} mode"], "tag": ["tagged {}"], "priority": ["with {} priority"],
    "count": ["{} times"], "quantity": ["{} of them", "x{}"], "amount": ["for {} dollars", "of {}"],
    "price": ["at {} each", "for {}"], "seconds": ["for {} seconds", "in {} seconds"], "days": ["for {} days"],
    "hours": ["for {} hours", "in {} hours"], "guests": ["for {} people"], "level": ["at level {}", "to level {}"],
    "volume": ["at volume {}"], "speed": ["at speed {}"], "rating": ["{} stars"], "percent": ["at {} percent", "to {}%"],
    "degrees": ["to {} degrees", "at {} degrees"], "fahrenheit": ["to {} fahrenheit"], "weeks": ["for {} weeks"],
    "urgent": ["urgent {}"], "public": ["public {}"], "repeat": ["repeat {}"], "reason": ["because {}"],
    "topic": ["about {}", "on {}"], "item": ["the {}"], "kind": ["of kind {}"], "zone": ["in zone {}"],
}
PARAM_NAMES = sorted(CARRIERS)
WHOLE = {"count", "quantity", "seconds", "minutes", "brightness", "days", "hours", "guests", "level", "volume", "speed", "rating",
         "percent", "weeks"}
DECIMAL = {"degrees", "celsius", "fahrenheit", "amount", "price"}
TRUTH = {"urgent", "public", "repeat"}
DECORATIONS = ["target", "new", "max", "min", "home", "main", "preferred", "default", "first", "last"]
APP_TOOLS = {"set_thermostat", "turn_on_lights", "start_timer", "play_music", "lock_door"}


def param_kind(plain):
    if plain in WHOLE:
        return "integer"
    if plain in DECIMAL:
        return "number"
    if plain in TRUTH:
        return "boolean"
    return "string"


def random_tool(rng, taken):
    """A made-up tool, and the plain argument each of its parameters stands for: some names are
    decorated ("home_city", "minutes_max"), so that a call's names are read from the schema, not
    recalled from the query's words."""
    while True:
        verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
        name = f"{verb}_{noun}"
        if name not in APP_TOOLS and all(not other.endswith(f"_{noun}") for other in taken):   # one tool per noun
            break
    plain = rng.sample(PARAM_NAMES, rng.randint(1, 3))
    decorated = [p if rng.random() < 0.8 else rng.choice([f"{rng.choice(DECORATIONS)}_{p}", f"{p}_{rng.choice(DECORATIONS)}"])
                 for p in plain]
    props = {}
    for d, p in zip(decorated, plain):
        props[d] = {"type": param_kind(p)}
        if rng.random() < 0.15:
            props[d]["description"] = p
    required = [d for d in decorated if rng.random() < 0.7] or decorated[:1]
    description = rng.choice([f"{verb.replace('_', ' ').capitalize()} a {noun}",
                              f"{verb.replace('_', ' ').capitalize()} the {noun}",
                              f"{verb.replace('_', ' ').capitalize()} a {noun}, optionally by {plain[-1]}"])
    return schema(name, description, props, required), dict(zip(decorated, plain))


def spoken(value):
    return json.dumps(value) if isinstance(value, bool) else str(value)


NAMED_STYLES = ["Please {verb} the {noun} with {named}.", "{Verb} {noun}: {named}", "I need to {verb} a {noun}, {named}",
                "Can you {verb} the {noun}? {named}", "Could you {verb} {noun} {named} thanks"]
OPENERS = ["", "", "Please ", "Can you ", "I want to ", "Could you ", "Go ahead and ", "I'd like to "]
OFF_TOPIC = ["Tell me a joke about penguins.", "What is the capital of Peru?", "Write a haiku about autumn.",
             "Who won the 1998 World Cup?", "Explain photosynthesis in one sentence.", "What's 17 times 23?",
             "Recommend a good science fiction novel.", "How are you today?", "What does HTTP stand for?",
             "Summarise the plot of Hamlet.", "Thanks, that's all.", "Is a tomato a fruit?"]


def pretrain_query(rng, verb, noun, args, plain):
    """The request in one of two voices: naming each argument ("city Paris, days 3"), or as people
    say it ("Book a hotel in Paris for 3 days", "The hotel in Paris for 3 days"), the arguments in any
    order; `plain` gives the argument each parameter stands for."""
    verb = verb.replace("_", " ")
    if rng.random() < 0.25:
        named = ", ".join(f"{plain[p]} {spoken(v)}" for p, v in args.items())
        return rng.choice(NAMED_STYLES).format(verb=verb, Verb=verb.capitalize(), noun=noun, named=named)
    said = [rng.choice(CARRIERS[plain[p]]).format(spoken(v)) for p, v in args.items()]
    rng.shuffle(said)
    if rng.random() < 0.3:
        head = f"{rng.choice(['the', 'my', 'a'])} {noun}"
    else:
        head = f"{rng.choice(OPENERS)}{verb} {rng.choice(['the', 'a', 'my', 'some'])} {noun}"
    query = " ".join([head] + said) + rng.choice(["", ".", " please", "?", " now"])
    return query[0].upper() + query[1:]


def pretrain_example(rng):
    tools, plain = [], {}
    for _ in range(rng.randint(1, 5)):
        tool, names = random_tool(rng, {t["name"] for t in tools})
        tools.append(tool)
        plain[tool["name"]] = names
    if rng.random() < 0.08:
        return {"query": rng.choice(OFF_TOPIC), "tools": tools, "answers": []}
    tool = rng.choice(tools)
    props = tool["parameters"]["properties"]
    keep = [p for p in props if p in tool["parameters"]["required"] or rng.random() < 0.5]
    args = {p: random_value(rng, props[p]["type"], plain[tool["name"]][p]) for p in keep}
    verb, noun = tool["name"].rsplit("_", 1)
    return {"query": pretrain_query(rng, verb, noun, args, plain[tool["name"]]), "tools": tools,
            "answers": [{"name": tool["name"], "arguments": args}]}

# --------------------------------------------------------------------------------------------
# The smart-home app: one tools prompt, its users' phrasings
# --------------------------------------------------------------------------------------------

ROOMS = ["kitchen", "bedroom", "living room", "office", "bathroom", "hallway", "nursery", "garage"]
ARTISTS = ["Nina Simone", "Miles Davis", "Daft Punk", "Adele", "Bach", "Fleetwood Mac", "Bob Marley",
           "Radiohead", "Beyonce", "Coldplay", "Queen", "Norah Jones"]
LABELS = ["pasta", "laundry", "tea", "eggs", "pizza", "homework", "bread", "nap"]
DOORS = ["front", "back", "garage", "patio", "side"]
# The tools' bounds: every closed set an enum, every number bounded, as cactus-needle 3.x's environments
# shape a tool surface, so that a call outside them is one the checks withhold and the model learns not to make.
CELSIUS = (10, 30)
BRIGHTNESS = (0, 100)
MINUTES = (1, 180)


def bounded(kind, low, high, **rest):
    return {"type": kind, "minimum": low, "maximum": high, **rest}


HOME_TOOLS = [
    schema("set_thermostat", "Set the target temperature of a room",
           {"room": {"type": "string", "enum": ROOMS}, "celsius": bounded("number", *CELSIUS)}, ["room", "celsius"]),
    schema("turn_on_lights", "Switch on the lights in a room, optionally dimmed",
           {"room": {"type": "string", "enum": ROOMS},
            "brightness": bounded("integer", *BRIGHTNESS, description="percent")}, ["room"]),
    schema("start_timer", "Start a countdown timer",
           {"minutes": bounded("integer", *MINUTES), "label": {"type": "string"}}, ["minutes"]),
    schema("play_music", "Play an artist, in one room or everywhere",
           {"artist": {"type": "string"}, "room": {"type": "string", "enum": ROOMS}}, ["artist"]),
    schema("lock_door", "Lock a door", {"door": {"type": "string", "enum": DOORS}}, ["door"]),
]
HOME_OFF_TOPIC = ["What's the weather like on Mars?", "Tell me a joke.", "Who wrote Pride and Prejudice?",
                  "How many legs does a spider have?", "Thanks, that's all for now.", "What day is it?",
                  "Good night!", "Can you recommend a podcast?"]
# Questions for the rows that replace repeats (home_dataset): a second list, so that the first stream's
# draws from HOME_OFF_TOPIC stay as they were.
MORE_OFF_TOPIC = ["How do I boil an egg?", "What's the capital of Canada?", "Are you a robot?",
                  "How tall is Mount Everest?", "Spell necessary for me.", "Who painted the Mona Lisa?",
                  "What rhymes with orange?", "Never mind.", "Is it going to snow in Oslo?", "What's a haiku?"]


def home_example(rng, tool=""):
    """A row of the app: a call of `tool`, or of one drawn at random ("", or None for a question that no
    tool serves)."""
    if tool == "":
        tool = rng.choices(["set_thermostat", "turn_on_lights", "start_timer", "play_music", "lock_door", None],
                           weights=[5, 5, 5, 5, 4, 2])[0]
    if tool is None:
        return {"query": rng.choice(HOME_OFF_TOPIC), "tools": HOME_TOOLS, "answers": []}
    if tool == "set_thermostat":
        room, c = rng.choice(ROOMS), rng.choice([17, 18, 19, 19.5, 20, 20.5, 21, 22, 22.5, 23, 24])
        query = rng.choice(["Make the {r} {c} degrees please", "I'd like the {r} at {c} degrees",
                            "Heat the {r} to {c}", "It's cold, set the {r} to {c} degrees",
                            "{c} degrees in the {r} please"]).format(r=room, c=c)
        args = {"room": room, "celsius": c}
    elif tool == "turn_on_lights":
        room = rng.choice(ROOMS)
        if rng.random() < 0.5:
            query = rng.choice(["Turn on the {r} lights", "Lights on in the {r}", "Can I get some light in the {r}?",
                                "Switch the {r} lights on"]).format(r=room)
            args = {"room": room}
        else:
            b = rng.choice([10, 20, 25, 30, 40, 50, 60, 70, 75, 80])
            query = rng.choice(["Dim the {r} lights to {b} percent", "{r} lights at {b}% please",
                                "Turn on the {r} lights at {b} percent"]).format(r=room, b=b)
            query = query[0].upper() + query[1:]
            args = {"room": room, "brightness": b}
    elif tool == "start_timer":
        m = rng.choice([2, 3, 4, 5, 7, 8, 10, 12, 15, 20, 25, 30, 45])
        if rng.random() < 0.6:
            label = rng.choice(LABELS)
            query = rng.choice(["Set a {m} minute timer for the {l}", "Remind me about the {l} in {m} minutes",
                                "Timer for the {l}, {m} minutes"]).format(m=m, l=label)
            args = {"minutes": m, "label": label}
        else:
            query = rng.choice(["Start a {m} minute timer", "Timer, {m} minutes", "Count down {m} minutes"]).format(m=m)
            args = {"minutes": m}
    elif tool == "play_music":
        artist = rng.choice(ARTISTS)
        if rng.random() < 0.5:
            room = rng.choice(ROOMS)
            query = rng.choice(["Play {a} in the {r}", "Put on some {a} in the {r}",
                                "I want to hear {a} in the {r}"]).format(a=artist, r=room)
            args = {"artist": artist, "room": room}
        else:
            query = rng.choice(["Play some {a}", "Put on {a}", "I'm in the mood for {a}"]).format(a=artist)
            args = {"artist": artist}
    else:
        door = rng.choice(DOORS)
        query = rng.choice(["Lock the {d} door", "Did I lock the {d} door? Lock it", "Make sure the {d} door is locked",
                            "Lock up the {d} door for the night"]).format(d=door)
        args = {"door": door}
    return {"query": query, "tools": HOME_TOOLS, "answers": [{"name": tool, "arguments": args}]}


# Rows that teach restraint, and two requests at once: a required value not said (missing), a request the
# user says not to do (negation), a value outside a tool's enum or bounds (invalid), a request no tool
# serves (irrelevant), all answered with no call; and two requests in one query (parallel), two calls.
MISSING = [
    ("Set the heating to {c} degrees", "Make it {c} degrees in here", "Bump the temperature up to {c}",
     "Change the temperature in the {r}", "Make the {r} warmer", "Adjust the {r} thermostat"),
    ("Turn on the lights", "Lights on please", "Dim the lights to {b} percent", "Can you switch a light on?"),
    ("Start a timer", "Set a timer for the {l}", "Timer please", "Start a countdown for the {l}"),
    ("Play some music", "Put some music on in the {r}", "Play something in the {r}", "I want to hear music"),
    ("Lock the door", "Lock up please", "Lock the door for me", "Can you lock the door?"),
]
NEGATION = [
    "Don't turn on the {r} lights", "Please do not switch the {r} lights on", "Never dim the {r} lights to {b} percent",
    "Don't set the {r} to {c} degrees", "Leave the {r} temperature alone, don't make it {c}",
    "Don't start a {m} minute timer", "No timer for the {l} please", "Do not play {a} in the {r}",
    "Don't put on any {a}", "Do not lock the {d} door", "Leave the {d} door unlocked, don't lock it",
]
# Values outside the tools' enums and bounds.
FAR_ROOMS = ["attic", "basement", "porch", "study", "dining room", "guest room", "laundry room", "balcony", "cellar"]
FAR_DOORS = ["cellar", "kitchen", "bathroom", "basement", "office"]
TOO_HOT_OR_COLD = [3, 5, 8, 35, 40, 45, 50, 60]
TOO_BRIGHT = [120, 150, 200, 300]
TOO_LONG = [0, 200, 240, 300, 500, 1000]
INVALID = [
    ("Set the {r} to {hot} degrees", "Heat the {r} to {hot}", "Make the {r} {hot} degrees please"),
    ("Dim the {r} lights to {bright} percent", "{R} lights at {bright}% please"),
    ("Start a {long} minute timer", "Set a {long} minute timer for the {l}"),
    ("Turn on the lights in the {far}", "Make the {far} {c} degrees", "Play {a} in the {far}"),
    ("Lock the {fardoor} door", "Make sure the {fardoor} door is locked"),
]
IRRELEVANT = [
    "Turn off the {r} lights", "Unlock the {d} door", "Stop the music", "Cancel the {l} timer",
    "What's the temperature in the {r}?", "Open the garage", "Vacuum the {r}", "Close the {r} blinds",
    "Is the {d} door locked?", "How long is left on the timer?", "Order more coffee", "Turn the {r} fan on",
]
# Each tool's request as the half of a two-request query, and its call.
HALVES = {
    "set_thermostat": ["set the {r} to {c} degrees", "make the {r} {c} degrees"],
    "turn_on_lights": ["turn on the {r} lights", "dim the {r} lights to {b} percent"],
    "start_timer": ["start a {m} minute timer", "set a {m} minute timer for the {l}"],
    "play_music": ["play {a}", "play {a} in the {r}"],
    "lock_door": ["lock the {d} door"],
}
JOINERS = [" and ", ", and ", ". Also ", " and also "]


def draw(rng):
    """One value of each kind a template may say: `{r}` a room, `{c}` degrees, … and outside the tools'
    bounds, `{hot}`, `{bright}`, `{long}`, `{far}` (a room) and `{fardoor}`."""
    values = dict(r=rng.choice(ROOMS), c=rng.choice([17, 18, 19, 19.5, 20, 21, 22, 23, 24]),
                  b=rng.choice([10, 20, 30, 40, 50, 60, 70, 80]), m=rng.choice([3, 5, 10, 15, 20, 30]),
                  l=rng.choice(LABELS), a=rng.choice(ARTISTS), d=rng.choice(DOORS), hot=rng.choice(TOO_HOT_OR_COLD),
                  bright=rng.choice(TOO_BRIGHT), long=rng.choice(TOO_LONG), far=rng.choice(FAR_ROOMS),
                  fardoor=rng.choice(FAR_DOORS))
    values["R"] = values["r"].capitalize()
    return values


def sentence(text):
    return text[0].upper() + text[1:]


def half_call(tool, template, values):
    """The call a half of a parallel request makes, its arguments those the half says."""
    says = {"room": "{r}", "celsius": "{c}", "brightness": "{b}", "minutes": "{m}", "label": "{l}", "artist": "{a}",
            "door": "{d}"}
    short = {"room": "r", "celsius": "c", "brightness": "b", "minutes": "m", "label": "l", "artist": "a", "door": "d"}
    properties = next(t for t in HOME_TOOLS if t["name"] == tool)["parameters"]["properties"]
    return {"name": tool, "arguments": {name: values[short[name]] for name in properties if says[name] in template}}


def restraint_example(rng, category):
    """A row of `category`: missing, negation, invalid or irrelevant (no call), or parallel (two calls)."""
    if category == "parallel":
        # Two tools, each half with its own values (two rooms in one query are two draws).
        halves = [(tool, rng.choice(HALVES[tool]), draw(rng)) for tool in rng.sample(sorted(HALVES), 2)]
        query = rng.choice(JOINERS).join(template.format(**values) for _, template, values in halves)
        calls = [half_call(tool, template, values) for tool, template, values in halves]
        return {"query": sentence(query), "tools": HOME_TOOLS, "answers": calls}
    if category == "missing":
        template = rng.choice(rng.choice(MISSING))
    else:
        template = rng.choice({"negation": NEGATION, "irrelevant": IRRELEVANT}.get(category) or rng.choice(INVALID))
    return {"query": sentence(template.format(**draw(rng))), "tools": HOME_TOOLS, "answers": []}


def words(query):
    """The dataset doctor's near-duplicate key: the query's words, lower-cased and sorted."""
    return " ".join(sorted(re.sub(r"[\W_]+", " ", query.lower()).split()))


def home_dataset(n, seed):
    """`n` rows of the app, none with the words of an earlier one (a repeat teaches one phrasing twice,
    and the doctor flags it), every tool called in at least MIN_CALLS of them. The rows are drawn from
    one stream, which skips a call whose query it drew before; the questions no tool serves come from a
    short list and repeat, and each repeat is then replaced, in its place, by a row from a second stream
    (seeded seed + 1): a call of the least-called tool while one is called fewer than MIN_CALLS times,
    else a question not asked yet. The other rows keep their places, and with them the held-out split
    a run draws by position."""
    first, second = random.Random(seed), random.Random(seed + 1)
    rows, drawn = [], set()
    while len(rows) < n:
        row = home_example(first)
        if row["query"] not in drawn or not row["answers"]:
            drawn.add(row["query"])
            rows.append(row)
    seen = set()
    for i, row in enumerate(rows):
        while words(row["query"]) in seen:
            calls = Counter({tool["name"]: 0 for tool in HOME_TOOLS})
            calls.update(call["name"] for other in rows for call in other["answers"])
            tool, count = min(calls.items(), key=lambda item: (item[1], item[0]))
            if count < MIN_CALLS:
                row = home_example(second, tool)
            else:
                asked = {other["query"] for other in rows}
                row = dict(home_example(second, None), query=second.choice(
                    [q for q in MORE_OFF_TOPIC if q not in asked]))
            rows[i] = row
        seen.add(words(row["query"]))
    calls = Counter(call["name"] for row in rows for call in row["answers"])
    assert all(calls[tool["name"]] >= MIN_CALLS for tool in HOME_TOOLS), calls
    return rows


# Rows of each kind added to the app's first 120: more of its calls, and the restraint and parallel rows.
MORE_ROWS = {"positive": 40, "parallel": 30, "missing": 28, "negation": 28, "invalid": 28, "irrelevant": 28}


def with_restraint(rows, seed):
    """`rows` and MORE_ROWS more from a third stream (seed + 2), none with the words of another row, all
    shuffled together (seed + 3)."""
    rng = random.Random(seed + 2)
    seen = {words(row["query"]) for row in rows}
    rows = list(rows)
    for category, count in MORE_ROWS.items():
        added = 0
        while added < count:
            if category == "positive":
                row = home_example(rng, rng.choice([tool["name"] for tool in HOME_TOOLS]))
            else:
                row = restraint_example(rng, category)
            if words(row["query"]) not in seen:
                seen.add(words(row["query"]))
                rows.append(row)
                added += 1
    random.Random(seed + 3).shuffle(rows)
    return rows


def write_dataset(seed=SEED):
    rows = with_restraint(home_dataset(120, seed), seed)
    with open(DATASET, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return rows


# --------------------------------------------------------------------------------------------
# The app's acceptance suite: written by hand, no query of the dataset's (nor its words in another order)
# --------------------------------------------------------------------------------------------
SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smart_home.suite.json")


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def case(query, calls, category, critical=False):
    return {"query": query, "calls": calls, "category": category, "critical": critical}


# Upstream's proportions: 18 positive, 4 missing, 3 irrelevant, 3 negation, 2 invalid, 2 parallel; the
# missing, negation and invalid ones critical (nine), as a wrong call there acts on what nobody asked.
SUITE_CASES = [
    case("Could you set the bedroom to 21 degrees", [call("set_thermostat", room="bedroom", celsius=21)], "positive"),
    case("Warm the living room up to 23 degrees", [call("set_thermostat", room="living room", celsius=23)], "positive"),
    case("Office temperature 19.5 please", [call("set_thermostat", room="office", celsius=19.5)], "positive"),
    case("Set the garage heating to 12 degrees", [call("set_thermostat", room="garage", celsius=12)], "positive"),
    case("Please switch on the bathroom lights", [call("turn_on_lights", room="bathroom")], "positive"),
    case("Put the hallway lights on at 40 percent", [call("turn_on_lights", room="hallway", brightness=40)], "positive"),
    case("Nursery lights to 15 percent", [call("turn_on_lights", room="nursery", brightness=15)], "positive"),
    case("I need light in the kitchen", [call("turn_on_lights", room="kitchen")], "positive"),
    case("Bedroom lights on at 5 percent", [call("turn_on_lights", room="bedroom", brightness=5)], "positive"),
    case("Begin a 6 minute timer", [call("start_timer", minutes=6)], "positive"),
    case("I need a 9 minute timer for the eggs", [call("start_timer", minutes=9, label="eggs")], "positive"),
    case("Time 35 minutes for the bread", [call("start_timer", minutes=35, label="bread")], "positive"),
    case("Play Radiohead", [call("play_music", artist="Radiohead")], "positive"),
    case("Can you play Miles Davis in the office", [call("play_music", artist="Miles Davis", room="office")], "positive"),
    case("Let's hear Coldplay in the garage", [call("play_music", artist="Coldplay", room="garage")], "positive"),
    case("Play Bob Marley everywhere", [call("play_music", artist="Bob Marley")], "positive"),
    case("Can you lock the side door", [call("lock_door", door="side")], "positive"),
    case("Front door, lock it", [call("lock_door", door="front")], "positive"),
    case("Set the temperature to 20 degrees", [], "missing", critical=True),
    case("Turn the lights on for me", [], "missing", critical=True),
    case("Start a timer for the laundry now", [], "missing", critical=True),
    case("Please lock the door now", [], "missing", critical=True),
    case("Switch off the kitchen lights", [], "irrelevant"),
    case("What's the humidity in the nursery?", [], "irrelevant"),
    case("Please unlock the back door", [], "irrelevant"),
    case("Don't play any Queen in the bedroom", [], "negation", critical=True),
    case("Please don't lock the garage door", [], "negation", critical=True),
    case("Do not start a 25 minute timer", [], "negation", critical=True),
    case("Dim the office lights to 140 percent", [], "invalid", critical=True),
    case("Set the hallway to 38 degrees", [], "invalid", critical=True),
    case("Turn on the hallway lights, then lock the back door",
         [call("turn_on_lights", room="hallway"), call("lock_door", door="back")], "parallel"),
    case("Set the kitchen to 22 degrees plus a 15 minute timer for the pasta",
         [call("set_thermostat", room="kitchen", celsius=22), call("start_timer", minutes=15, label="pasta")], "parallel"),
]


def write_suite(rows):
    taken = {words(row["query"]) for row in rows}
    copied = [c["query"] for c in SUITE_CASES if words(c["query"]) in taken]
    assert not copied, f"suite queries the dataset holds: {copied}"
    suite = {"name": "smart_home", "tools": HOME_TOOLS, "cases": SUITE_CASES}
    with open(SUITE, "w", encoding="utf-8") as f:
        json.dump(suite, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    write_suite(write_dataset())
