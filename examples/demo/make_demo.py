"""Make the app's first-run example: the smart-home dataset, and a small Needle 2 base meant to write
tool calls for tools it never saw, so that fine-tuning on the dataset visibly helps.

    examples/demo/make_demo.py --dataset-only   # smart_home.jsonl alone, in a second
    examples/demo/make_demo.py [--steps N]      # and the base (python3 with cactus-needle==2.0.8 jax flax optax sentencepiece)

The dataset (smart_home.jsonl next to this file, 120 rows) is one app's: five tools in one tools
prompt, as an app sends them with every request; its users' own phrasings ("Make the kitchen 19.5 degrees please",
"Put on some Nina Simone"), arguments left out when the user does not say them, and questions that
need no call. A Quick run holds out 24 of them.

The base, written with its tokenizer to --out (default: next to this file):
    tokenizer.model   sentencepiece BPE over the pre-training corpus alone (pad 0, eos 1, bos 2,
                      unk 3, the ten chat markers at 4..13, byte fallback, every digit a piece of its
                      own so that numbers copy from a query into a call piece by piece)
    base.pkl          a format-v2 checkpoint stored as float16, pre-trained by the reference's own
                      network (SimpleAttentionNetwork) with full-parameter AdamW on generated calls
The pre-training corpus holds made-up tools over common words (1 to 5 a row; some parameter names
decorated, such as "home_city"), queries that either name each argument ("city Paris, days 3") or say
it as people do ("Book a hotel in Paris for 3 days", the tool's verb sometimes left out), and
questions that need no call. The words are common ones (rooms, people's and artists' names, minutes,
degrees), each seen in queries and copied into calls, as any base model has seen them; the app's five
tools and its users' phrasings are not in it. The tokenizer learns from that corpus alone: trained on
the app's rows too, it would make pieces of the app's words that pre-training never trains.

Everything is seeded; JAX runs on CPU.
"""
import argparse
import json
import os
import pickle
import random
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax

from needle.model import finetune
from needle.model.architecture import SimpleAttentionNetwork, TransformerConfig
from needle.model.run import CHECKPOINT_FORMAT_VERSION
from needle.model.tokenizer import CHAT_MARKERS, SANTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from fixture_common import masked_train_step, train_bpe  # noqa: E402  (shared with the fixtures)

DATASET = os.path.join(HERE, "smart_home.jsonl")
VOCAB = 2048
SHAPE = dict(vocab_size=VOCAB, d_model=256, num_heads=8, num_kv_heads=4, num_layers=4,
             max_seq_len=512, contrastive_dim=32, mhc_lanes=2, engram_layers=(1,), engram_slots=512)


def log(msg):
    print(f"[make_demo] {msg}", flush=True)


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
KINDS = ["string"] * 5 + ["integer"] * 2 + ["number", "boolean"]
WHOLE = {"count", "quantity", "seconds", "minutes", "brightness", "days", "hours", "guests", "level", "volume", "speed", "rating",
         "percent", "weeks"}
DECIMAL = {"degrees", "celsius", "fahrenheit", "amount", "price"}
TRUTH = {"urgent", "public", "repeat"}
DECORATIONS = ["target", "new", "max", "min", "home", "main", "preferred", "default", "first", "last"]
APP_TOOLS = {"set_thermostat", "turn_on_lights", "start_timer", "play_music", "lock_door"}


def param_kind(rng, plain):
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
        props[d] = {"type": param_kind(rng, p)}
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

HOME_TOOLS = [
    schema("set_thermostat", "Set the target temperature of a room",
           {"room": {"type": "string"}, "celsius": {"type": "number"}}, ["room", "celsius"]),
    schema("turn_on_lights", "Switch on the lights in a room, optionally dimmed",
           {"room": {"type": "string"}, "brightness": {"type": "integer", "description": "percent"}}, ["room"]),
    schema("start_timer", "Start a countdown timer",
           {"minutes": {"type": "integer"}, "label": {"type": "string"}}, ["minutes"]),
    schema("play_music", "Play an artist, in one room or everywhere",
           {"artist": {"type": "string"}, "room": {"type": "string"}}, ["artist"]),
    schema("lock_door", "Lock a door", {"door": {"type": "string"}}, ["door"]),
]
ROOMS = ["kitchen", "bedroom", "living room", "office", "bathroom", "hallway", "nursery", "garage"]
ARTISTS = ["Nina Simone", "Miles Davis", "Daft Punk", "Adele", "Bach", "Fleetwood Mac", "Bob Marley",
           "Radiohead", "Beyonce", "Coldplay", "Queen", "Norah Jones"]
LABELS = ["pasta", "laundry", "tea", "eggs", "pizza", "homework", "bread", "nap"]
DOORS = ["front", "back", "garage", "patio", "side"]
HOME_OFF_TOPIC = ["What's the weather like on Mars?", "Tell me a joke.", "Who wrote Pride and Prejudice?",
                  "How many legs does a spider have?", "Thanks, that's all for now.", "What day is it?",
                  "Good night!", "Can you recommend a podcast?"]


def home_example(rng):
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


def home_dataset(n, seed):
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        row = home_example(rng)
        key = row["query"]
        if key not in seen or not row["answers"]:
            seen.add(key)
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Tokenizer, pre-training, checkpoint
# --------------------------------------------------------------------------------------------

def train_tokenizer(rows, path):
    sentences = ["".join(finetune.render_example(row)) for row in rows]
    # Digits one piece each: merged, "12" in a query and '":12,"' in its call would be unrelated
    # pieces, and a small model never learns to copy numbers.
    train_bpe(sentences, path, VOCAB, CHAT_MARKERS, coverage=1.0, split_digits=True)
    return SANTokenizer(path)


def encode_rows(tok, rows, length):
    """Token ids padded to `length`, and the loss mask of finetune's own encoding (the answer)."""
    ids, mask = zip(*(finetune._encode(tok, row, length) for row in rows))
    return np.array(ids, np.int32), np.array(mask, np.float32)


def bucket(tok, row):
    prompt, target = finetune.render_example(row)
    n = len(tok.encode(prompt)) + len(tok.encode(target)) + 2
    return next(b for b in (96, 128, 192, 256, 384, 512) if n <= b)


def pretrain(tok, rows, steps, batch, lr, seed, save_every, out):
    config = TransformerConfig(**SHAPE, dtype="float32")
    model = SimpleAttentionNetwork(config)
    params = model.init(jax.random.PRNGKey(seed), jnp.ones((1, 16), jnp.int32))["params"]
    log(f"{sum(a.size for a in jax.tree.leaves(params)):,} parameters")
    by_bucket = {}
    for row in rows:
        by_bucket.setdefault(bucket(tok, row), []).append(row)
    groups = {b: encode_rows(tok, rs, b) for b, rs in by_bucket.items()}
    sizes = np.array([len(groups[b][0]) for b in sorted(groups)], np.float64)
    log("buckets " + ", ".join(f"{b}: {len(groups[b][0])}" for b in sorted(groups)))
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr / 20)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    opt_state = optimizer.init(params)
    step_fn = masked_train_step(model, optimizer)

    rng = np.random.default_rng(seed)
    started, losses = time.time(), []
    for step in range(1, steps + 1):
        b = sorted(groups)[rng.choice(len(sizes), p=sizes / sizes.sum())]
        ids, mask = groups[b]
        pick = rng.choice(len(ids), min(batch, len(ids)), replace=False)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(ids[pick]), jnp.asarray(mask[pick]))
        losses.append(float(loss))
        if step % 50 == 0 or step == steps:
            log(f"step {step}/{steps} answer loss {np.mean(losses[-50:]):.4f} ({time.time() - started:.0f}s)")
        if step % save_every == 0 or step == steps:
            save(out, params, config, step, {"seed": seed, "examples": len(rows), "batch": batch, "lr": lr})
    return params


def save(path, params, config, step, run):
    """A format-v2 checkpoint, float16 like a released one would be stored compactly; written to a
    temporary file and renamed, so an interrupted run leaves the last good one."""
    fields = {k: getattr(config, k) for k in config.__dataclass_fields__}
    fields["dtype"] = "bfloat16"   # as released checkpoints say; every run computes in float32
    params = jax.tree.map(lambda a: np.asarray(a, np.float16), params)
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"format_version": CHECKPOINT_FORMAT_VERSION, "params": params, "config": fields,
                     "step": step, "run": dict(run, name="needle-studio demo base")}, f)
    os.replace(path + ".tmp", path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--out", default=os.path.join(HERE, "base.pkl"))
    parser.add_argument("--dataset-only", action="store_true", help="write smart_home.jsonl and stop")
    args = parser.parse_args()

    home = home_dataset(120, args.seed)
    with open(DATASET, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in home)
    if args.dataset_only:
        return
    rng = random.Random(args.seed)
    corpus = [pretrain_example(rng) for _ in range(args.examples)]
    tok = train_tokenizer(corpus, os.path.join(os.path.dirname(args.out), "tokenizer.model"))
    lengths = [len(tok.encode("".join(finetune.render_example(r)))) for r in home]
    log(f"smart_home: {len(home)} rows, {min(lengths)}-{max(lengths)} tokens")
    pretrain(tok, corpus, args.steps, args.batch, args.lr, args.seed, args.save_every, args.out)


if __name__ == "__main__":
    main()
