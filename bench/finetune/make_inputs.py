"""Inputs for the fine-tuning side-by-side benchmark (bench/finetune_side_by_side.sh).

    PYTHON bench/finetune/make_inputs.py OUTDIR [--generation 3|2] [--examples 160] [--test-examples 40]
        [--tool-sets 8 | --tools-per-row] [--d-model 256] [--layers 6] [--heads 4] [--kv-heads 2] [--mhc-lanes 4]
        [--engram-layers L,..] [--engram-slots N] [--max-seq-len 2048] [--vocab 2048] [--seed 0]
        [Needle 3: --qk-head-dim 48 --v-head-dim 64 --global-layers 2,5 --sliding-window 512 --qkv-conv-taps 3]
        [Needle 2: --contrastive-dim 64]

PYTHON is the --generation's reference (cactus-needle 3.2.8 for 3, the default; 2.0.8 for 2): the
tokenizer's chat markers, the rendering and the checkpoint all come from the installed package, and
it is refused when it is not the generation asked for.

Writes into OUTDIR:

  train.jsonl      --examples rows in the reference's tool-call format (`query`, `tools`,
                   `answers`, optional `reasoning` / `system`) the two fine-tunes train on
  test.jsonl       --test-examples rows from the same generator (same tool sets, other queries),
                   seen by neither run: both adapters are scored on it with the reference's loss
  tokenizer.model  by default a sentencepiece BPE of --vocab 2048 pieces trained on the rendered
                   train.jsonl with the fixture tokenizer's settings (byte fallback, identity
                   normalisation, the package's chat markers from id 4: ten in 2.0.8, sixteen in
                   3.2.8), rows rendered by the package's render_example. With --vocab 0 it is a copy of
                   tests/fixtures/models/tokenizer.model (vocab 512), but that one was trained on
                   tiny fixture data, byte-falls-back on many letters and digits and averages ~1.9
                   characters per token, so these tool prompts come out at 1400-4000 tokens and
                   most rows are truncated at --max-len 1024; the trained 2048-piece model gives
                   ~4.5 characters per token (closer to the released 8192-piece tokenizer);
                   it is a Needle 2 tokenizer, so --vocab 0 is for --generation 2 only
  base.pkl         Needle 2: a format-v2 checkpoint made by the reference's own code: random init of
                   SimpleAttentionNetwork (every parameter, incl. the contrastive/confidence
                   heads), constant-initialised leaves perturbed with seeded noise like the
                   fixtures do (so no LoRA target is all-zero), float32, vocab = the tokenizer's
  base.safetensors Needle 3: the same made by 3.2.8's code (make_needle3_fixtures.py's
                   write_seeded_checkpoint: every parameter incl. the embedding, confidence and
                   router probe heads a released checkpoint has), stored by its write_checkpoint
  inputs.json      what was made: sizes, token-length statistics, tool-prompt sharing

The default model shape is each generation's released one scaled down alike (SHAPES below):
d_model 768 -> 256, 6 layers, 4 heads; Needle 3 keeps its released per-head widths (q/k 48, v 64), 2
KV heads, 3 conv taps and 4 lanes, and its window (1024 of 4096 positions) becomes 512 of 2048, so
the longer rows outrun it as the released model's long rows do.

With --tools-per-row every row gets a tool set of its own instead (a fresh draw of domain, tools,
order and descriptions), so no two rows share more than the chat template's first tokens.

Otherwise the data is built around SHARED tool prompts: --tool-sets tool sets (3-8 tools each, long
descriptions and parameter schemas, sized by a character budget so a rendered prompt is roughly
400-900 tokens with the default tokenizer) and many queries per set, so rows in one batch often share the same
tool-prompt prefix. Queries vary in length (0-3 sentences of context before the request), ~10 %
are multi-call, ~8 % off-topic refusals (`answers: []`), ~45 % carry `reasoning`, ~10 % a
`system` prompt. Argument values always appear verbatim in the query.

Everything is seeded; JAX runs on CPU.
"""
import argparse
import json
import os
import pickle
import random
import shutil
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURE_TOKENIZER = os.path.join(REPO, "tests", "fixtures", "models", "tokenizer.model")

# --------------------------------------------------------------------------------------------
# Parameter library: type, JSON-schema extras, description, values, how a query says it.
# --------------------------------------------------------------------------------------------

P = {
    "city": ("string", {}, "Name of the city, as the user wrote it. Do not translate or expand abbreviations; "
             "if the user names a neighbourhood, pass the city it belongs to.",
             ["Berlin", "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Austin", "Seoul", "Rome", "Nairobi",
              "Toronto", "Lisbon", "Denver", "Kyoto", "Porto"], "in {v}"),
    "date": ("string", {"format": "date"}, "Calendar date the request refers to. Relative dates such as "
             "'tomorrow' are passed through unchanged; the backend resolves them in the user's time zone.",
             ["tomorrow", "Monday", "next Friday", "May 3", "June 21", "2024-12-01", "the 14th"], "on {v}"),
    "time": ("string", {}, "Local time of day, in whatever notation the user used (12h or 24h).",
             ["7am", "noon", "3:30pm", "9pm", "18:00", "midnight", "8:15am"], "at {v}"),
    "guests": ("integer", {"minimum": 1, "maximum": 20}, "Number of people including the user.",
               list(range(1, 13)), "for {v} people"),
    "amount": ("number", {"minimum": 0}, "Monetary amount in the stated currency, without the currency "
               "symbol. Use a decimal point, never a thousands separator.",
               [4.99, 12.5, 30, 99.95, 250, 1200, 7.25, 63.4], "of {v}"),
    "currency": ("string", {"enum": ["USD", "EUR", "GBP", "JPY", "CHF", "SEK", "INR"]},
                 "ISO 4217 code of the currency. Map symbols and names to codes only when unambiguous.",
                 ["USD", "EUR", "GBP", "JPY", "CHF", "SEK", "INR"], "in {v}"),
    "recipient": ("string", {}, "Full name or handle of the person who receives the message or payment, "
                  "exactly as it appears in the user's contacts.",
                  ["Alice", "Bob Marley", "Chen Wei", "Dana", "Emil", "Fatima", "Greta", "Hiro"], "to {v}"),
    "email": ("string", {"format": "email"}, "Email address; must contain an @ and a domain.",
              ["ann@example.com", "ops@acme.io", "bo@mail.net", "team@startup.dev"], "at {v}"),
    "subject": ("string", {"maxLength": 120}, "Short subject line summarising the message. Keep the user's "
                "wording; do not add prefixes such as 'Re:'.",
                ["quarterly report", "lunch plans", "server outage", "holiday schedule", "invoice 4471"],
                "about {v}"),
    "body": ("string", {}, "Free-text body. Preserve the user's wording, punctuation and line breaks.",
             ["running ten minutes late", "see the attached numbers", "can we move it to Thursday",
              "thanks for the quick fix"], "saying '{v}'"),
    "title": ("string", {}, "Human-readable title of the item, used in lists and notifications.",
              ["Blue Moon", "Daily Standup", "Road Trip", "Summer Mix", "Q3 Plan", "Dune", "Budget Review"],
              "called '{v}'"),
    "duration_minutes": ("integer", {"minimum": 1, "maximum": 600}, "Length in whole minutes. Convert hours "
                         "to minutes when the user gives hours.", [5, 10, 15, 25, 30, 45, 60, 90, 120],
                         "for {v} minutes"),
    "temperature": ("number", {"minimum": 5, "maximum": 35}, "Target temperature in degrees Celsius; half "
                    "degrees are allowed.", [18, 19.5, 20, 21.5, 22, 23], "to {v} degrees"),
    "room": ("string", {}, "Room as named in the home setup. Unknown rooms are rejected by the hub, so use "
             "the user's exact words.", ["kitchen", "bedroom", "office", "living room", "garage", "nursery"],
             "in the {v}"),
    "brightness": ("integer", {"minimum": 0, "maximum": 100}, "Brightness in percent, 0 meaning off.",
                   [0, 10, 25, 40, 50, 75, 100], "at {v} percent"),
    "color": ("string", {}, "Colour name or hex code understood by the bulbs.",
              ["red", "green", "blue", "warm white", "purple", "#ffaa00"], "in {v}"),
    "enabled": ("boolean", {}, "true to switch the feature on, false to switch it off.", [True, False],
                "{v}"),
    "query": ("string", {}, "Search terms, copied from the request without stop words removed.",
              ["jazz", "tacos", "running shoes", "sci-fi", "tax forms", "yoga mats", "noise cancelling"],
              "for {v}"),
    "quantity": ("integer", {"minimum": 1}, "How many units. Defaults to one when the user does not say.",
                 list(range(1, 10)), "{v} of them"),
    "priority": ("string", {"enum": ["low", "normal", "high", "urgent"]}, "How urgent the item is.",
                 ["low", "normal", "high", "urgent"], "with {v} priority"),
    "airport": ("string", {"pattern": "^[A-Z]{3}$"}, "IATA code of the airport. Cities with several "
                "airports need the specific code.", ["BER", "CDG", "HND", "LIM", "OSL", "JFK", "SFO"],
                "from {v}"),
    "seat": ("string", {"enum": ["window", "aisle", "middle"]}, "Seat preference.",
             ["window", "aisle", "middle"], "with a {v} seat"),
    "distance_km": ("number", {"minimum": 0}, "Distance in kilometres, decimals allowed.",
                    [2.5, 5, 10, 21.1, 42.2, 3.7], "over {v} km"),
    "activity": ("string", {}, "Kind of exercise, e.g. running, cycling, swimming.",
                 ["running", "cycling", "swimming", "rowing", "yoga", "hiking"], "doing {v}"),
    "playlist": ("string", {}, "Name of an existing playlist in the user's library.",
                 ["Morning Run", "Focus", "Chill Sunday", "Road Trip", "Throwbacks"], "on {v}"),
    "volume": ("integer", {"minimum": 0, "maximum": 100}, "Playback volume in percent.",
               [10, 20, 35, 50, 65, 80], "at volume {v}"),
    "ticker": ("string", {"pattern": "^[A-Z]{1,5}$"}, "Stock ticker symbol in upper case.",
               ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN"], "for {v}"),
    "account": ("string", {"enum": ["checking", "savings", "credit", "brokerage"]},
                "Which of the user's accounts to use.", ["checking", "savings", "credit", "brokerage"],
                "from {v}"),
    "service": ("string", {}, "Name of the deployed service as listed in the service catalogue.",
                ["billing-api", "auth", "search-indexer", "web-frontend", "payments"], "for {v}"),
    "environment": ("string", {"enum": ["dev", "staging", "production"]}, "Deployment environment.",
                    ["dev", "staging", "production"], "in {v}"),
    "version": ("string", {}, "Release version or git tag to act on.",
                ["v1.4.2", "v2.0.0", "2024.11.3", "v0.9.1-rc1"], "at {v}"),
    "replicas": ("integer", {"minimum": 0, "maximum": 64}, "Desired number of running instances.",
                 [0, 1, 2, 3, 4, 6, 8, 12], "to {v} replicas"),
    "dose_mg": ("number", {"minimum": 0}, "Dose in milligrams as written on the prescription.",
                [5, 10, 20, 50, 200, 400], "of {v} mg"),
    "medication": ("string", {}, "Medication name as written on the label.",
                   ["ibuprofen", "amoxicillin", "vitamin D", "metformin", "cetirizine"], "of {v}"),
    "note": ("string", {}, "Optional note attached to the item; keep it verbatim.",
             ["bring the blue folder", "gate code 4412", "no onions please", "call before arriving"],
             "with the note '{v}'"),
    "language": ("string", {}, "Target language, by English name.",
                 ["French", "German", "Japanese", "Spanish", "Italian", "Korean"], "into {v}"),
    "rating": ("integer", {"minimum": 1, "maximum": 5}, "Star rating from 1 to 5.", [1, 2, 3, 4, 5],
               "with {v} stars"),
}

# --------------------------------------------------------------------------------------------
# Domains: each gives one tool set (3-8 tools).
# --------------------------------------------------------------------------------------------

DOMAINS = [
    ("travel", "the user's travel bookings", [
        ("search_flights", "Search", "flights", ["airport", "date", "seat"], ["airport", "date"]),
        ("book_hotel", "Book", "hotel room", ["city", "date", "guests", "note"], ["city", "date"]),
        ("cancel_booking", "Cancel", "booking", ["title", "note"], ["title"]),
        ("check_weather", "Check", "weather forecast", ["city", "date"], ["city"]),
        ("convert_currency", "Convert", "currency amount", ["amount", "currency"], ["amount", "currency"]),
        ("reserve_table", "Reserve", "restaurant table", ["city", "guests", "time", "note"], ["guests", "time"]),
    ]),
    ("smart_home", "the user's smart-home hub", [
        ("set_thermostat", "Set", "thermostat", ["room", "temperature", "enabled"], ["room", "temperature"]),
        ("set_lights", "Adjust", "lights", ["room", "brightness", "color"], ["room", "brightness"]),
        ("lock_door", "Lock", "door", ["room", "enabled"], ["room"]),
        ("start_vacuum", "Start", "robot vacuum", ["room", "duration_minutes"], ["room"]),
        ("set_timer", "Set", "kitchen timer", ["duration_minutes", "title"], ["duration_minutes"]),
    ]),
    ("finance", "the user's bank and brokerage accounts", [
        ("send_payment", "Send", "payment", ["recipient", "amount", "currency", "account", "note"],
         ["recipient", "amount", "currency"]),
        ("get_stock_quote", "Get", "stock quote", ["ticker"], ["ticker"]),
        ("buy_stock", "Buy", "stock", ["ticker", "quantity", "account"], ["ticker", "quantity"]),
        ("transfer_funds", "Transfer", "funds between accounts", ["amount", "account", "currency"],
         ["amount", "account"]),
        ("file_expense", "File", "expense report", ["amount", "currency", "title", "date"], ["amount", "title"]),
        ("set_budget_alert", "Create", "budget alert", ["amount", "account", "enabled"], ["amount"]),
        ("list_transactions", "List", "recent transactions", ["account", "date", "quantity"], ["account"]),
    ]),
    ("fitness", "the user's fitness tracker", [
        ("log_workout", "Log", "workout", ["activity", "duration_minutes", "distance_km"],
         ["activity", "duration_minutes"]),
        ("start_workout", "Start", "workout session", ["activity", "playlist"], ["activity"]),
        ("set_step_goal", "Set", "daily step goal", ["quantity", "enabled"], ["quantity"]),
        ("log_meal", "Log", "meal", ["title", "quantity", "time"], ["title"]),
    ]),
    ("communication", "the user's email and messaging accounts", [
        ("send_email", "Send", "email", ["email", "subject", "body", "priority"], ["email", "subject", "body"]),
        ("send_message", "Send", "chat message", ["recipient", "body"], ["recipient", "body"]),
        ("schedule_meeting", "Schedule", "meeting", ["title", "date", "time", "duration_minutes", "email"],
         ["title", "date", "time"]),
        ("translate_text", "Translate", "text", ["body", "language"], ["body", "language"]),
        ("create_reminder", "Create", "reminder", ["title", "date", "time", "priority"], ["title", "date"]),
        ("search_inbox", "Search", "inbox", ["query", "date"], ["query"]),
    ]),
    ("music", "the user's music streaming account", [
        ("play_playlist", "Play", "playlist", ["playlist", "volume"], ["playlist"]),
        ("search_music", "Search", "music catalogue", ["query", "quantity"], ["query"]),
        ("set_volume", "Set", "speaker volume", ["volume", "room"], ["volume"]),
        ("rate_song", "Rate", "song", ["title", "rating"], ["title", "rating"]),
    ]),
    ("shopping", "the user's online store account", [
        ("search_products", "Search", "product catalogue", ["query", "amount", "currency"], ["query"]),
        ("add_to_cart", "Add", "item to the cart", ["title", "quantity"], ["title", "quantity"]),
        ("track_package", "Track", "package", ["title"], ["title"]),
        ("return_item", "Return", "item", ["title", "quantity", "note"], ["title"]),
        ("rate_product", "Rate", "product", ["title", "rating", "body"], ["title", "rating"]),
        ("apply_coupon", "Apply", "coupon", ["title", "amount"], ["title"]),
        ("order_groceries", "Order", "groceries", ["query", "quantity", "date", "time"], ["query", "date"]),
        ("cancel_order", "Cancel", "order", ["title", "note"], ["title"]),
    ]),
    ("devops", "the user's cloud deployment", [
        ("deploy_service", "Deploy", "service", ["service", "version", "environment"],
         ["service", "version", "environment"]),
        ("scale_service", "Scale", "service", ["service", "replicas", "environment"], ["service", "replicas"]),
        ("rollback_service", "Roll back", "service", ["service", "environment", "version"], ["service"]),
        ("get_logs", "Fetch", "service logs", ["service", "environment", "duration_minutes"], ["service"]),
        ("open_incident", "Open", "incident", ["service", "priority", "body"], ["service", "priority"]),
    ]),
    ("health", "the user's health records app", [
        ("log_medication", "Log", "medication dose", ["medication", "dose_mg", "time"], ["medication", "dose_mg"]),
        ("set_medication_reminder", "Set", "medication reminder", ["medication", "time", "enabled"],
         ["medication", "time"]),
        ("book_appointment", "Book", "doctor appointment", ["date", "time", "note"], ["date", "time"]),
    ]),
    ("calendar", "the user's calendar", [
        ("create_event", "Create", "calendar event", ["title", "date", "time", "duration_minutes", "note"],
         ["title", "date"]),
        ("move_event", "Move", "calendar event", ["title", "date", "time"], ["title", "date"]),
        ("delete_event", "Delete", "calendar event", ["title", "date"], ["title"]),
        ("find_free_slot", "Find", "free slot", ["date", "duration_minutes"], ["date", "duration_minutes"]),
        ("share_calendar", "Share", "calendar", ["email", "enabled"], ["email"]),
    ]),
    ("dining", "the user's food delivery app", [
        ("order_food", "Order", "food delivery", ["query", "quantity", "time", "note"], ["query"]),
        ("reserve_table", "Reserve", "restaurant table", ["title", "guests", "date", "time"],
         ["title", "guests", "time"]),
        ("rate_restaurant", "Rate", "restaurant", ["title", "rating", "body"], ["title", "rating"]),
        ("tip_driver", "Tip", "delivery driver", ["amount", "currency"], ["amount"]),
    ]),
    ("language", "the user's language-learning app", [
        ("translate_text", "Translate", "text", ["body", "language"], ["body", "language"]),
        ("start_lesson", "Start", "lesson", ["language", "duration_minutes"], ["language"]),
        ("add_flashcard", "Add", "flashcard", ["body", "language", "note"], ["body", "language"]),
    ]),
]

MIN_PROMPT_CHARS, MAX_PROMPT_CHARS = 2000, 3500

_DESC_EXTRA = [
    "Only call this when the user clearly asks for it; if details are missing, leave optional fields out "
    "rather than guessing.",
    "The call is executed immediately and the result is shown to the user, so double-check every value "
    "against the request before calling.",
    "Requires the user to be signed in. Values must be copied from the request, not inferred from earlier "
    "turns of the conversation.",
    "Returns a confirmation object with an id that later calls can reference. Errors are reported back to "
    "the assistant as a tool result.",
    "Idempotent: calling it twice with the same arguments has the same effect as calling it once.",
]

_CONTEXT = [
    "I'm in a bit of a rush this morning.", "Quick one before my next meeting.",
    "My partner asked me to sort this out yesterday and I completely forgot.",
    "This is for the trip we talked about last week.", "Hope this isn't too much trouble.",
    "The app kept crashing earlier, so let's try again.",
    "Okay, so here is what I need, and please get the details exactly right this time.",
    "Following up on the thing from the standup.", "It's been a long day.",
    "My sister recommended doing this through the assistant.",
]
_PHRASING = ["Please {verb} the {noun} {args}.", "{Verb} {noun} {args}", "Can you {verb} a {noun} {args}?",
             "I need to {verb} my {noun} {args}.", "{Verb} the {noun} {args} now, thanks.",
             "Could you {verb} the {noun} {args} for me?"]
_OFF_TOPIC = ["Tell me a joke about penguins.", "What is the capital of Peru?", "Write a haiku about autumn.",
              "Who won the 1998 World Cup?", "Explain photosynthesis in one sentence.", "What's 17 times 23?",
              "Recommend a good science fiction novel.", "How far away is the moon?"]
_SYSTEMS = ["You are a careful assistant. Call tools only when asked.",
            "You are a concise home assistant.\nNever invent argument values."]


def _param_schema(name, rng):
    typ, extra, desc, _values, _phrase = P[name]
    if rng.random() < 0.6:   # most parameters carry only the first sentence of their description
        desc = desc.split(". ")[0].rstrip(".") + "."
    return dict({"type": typ, "description": desc}, **extra)


def make_tool(domain_desc, name, verb, noun, params, required, rng):
    sentences = [f"{verb} a {noun} in {domain_desc}.",
                 f"Use this tool whenever the user wants to {verb.lower()} a {noun}; it accepts "
                 f"{', '.join(params)}."]
    sentences += rng.sample(_DESC_EXTRA, rng.randint(0, 1))
    return {"name": name, "description": " ".join(sentences),
            "parameters": {"type": "object",
                           "properties": {p: _param_schema(p, rng) for p in params},
                           "required": list(required)}}


def make_tool_sets(rng, count):
    domains = rng.sample(DOMAINS, min(count, len(DOMAINS)))
    sets = []
    for domain, desc, tools in domains:
        # Tools are added in random order until the schema JSON reaches a per-set character
        # budget (at least 3 tools): ~400-900 prompt tokens at ~4.5 characters per token.
        budget = rng.randint(MIN_PROMPT_CHARS, MAX_PROMPT_CHARS)
        specs, schemas, used = [], [], 0
        for t in rng.sample(tools, len(tools)):
            spec = dict(name=t[0], verb=t[1], noun=t[2], params=t[3], required=t[4])
            schema = make_tool(desc, spec["name"], spec["verb"], spec["noun"], spec["params"],
                               spec["required"], rng)
            size = len(json.dumps(schema, separators=(",", ":")))
            if len(specs) >= 3 and used >= budget:
                break
            specs.append(spec)
            schemas.append(schema)
            used += size
        sets.append({"domain": domain, "schemas": schemas, "specs": specs})
    return sets


def _call(rng, spec):
    """(phrase, arguments, reasoning) for one call of `spec`: required params plus some optional."""
    optional = [p for p in spec["params"] if p not in spec["required"]]
    params = list(spec["required"]) + [p for p in optional if rng.random() < 0.5]
    args, spoken = {}, []
    for p in params:
        v = rng.choice(P[p][3])
        args[p] = v
        spoken.append(P[p][4].format(v=json.dumps(v) if isinstance(v, bool) else v))
    reasoning = ", ".join(f"{p} {json.dumps(v) if isinstance(v, bool) else v}" for p, v in args.items())
    return " ".join(spoken), args, reasoning


def make_example(rng, tool_set):
    row = {}
    if rng.random() < 0.10:
        row["system"] = rng.choice(_SYSTEMS)
    context = " ".join(rng.sample(_CONTEXT, rng.choice([0, 0, 1, 1, 2, 3])))
    if rng.random() < 0.08:
        query, answers, reasoning = rng.choice(_OFF_TOPIC), [], "no tool fits this request"
    else:
        n_calls = 2 if rng.random() < 0.10 and len(tool_set["specs"]) > 1 else 1
        specs = rng.sample(tool_set["specs"], n_calls)
        parts, answers, why = [], [], []
        for spec in specs:
            phrase, args, reason = _call(rng, spec)
            verb = spec["verb"].lower()
            parts.append(rng.choice(_PHRASING).format(verb=verb, Verb=spec["verb"], noun=spec["noun"],
                                                      args=phrase))
            answers.append({"name": spec["name"], "arguments": args})
            why.append(f"{spec['name']}: {reason}")
        query, reasoning = " Also, ".join(parts), "; ".join(why)
    row["query"] = (context + " " + query).strip()
    row["tools"] = tool_set["schemas"]
    if rng.random() < 0.45:
        row["reasoning"] = reasoning
    row["answers"] = answers
    return row


def make_rows(rng, tool_sets, n):
    # Skewed use of the tool sets (some much more frequent), like a real product's traffic.
    weights = [1.0 / (i + 1) ** 0.5 for i in range(len(tool_sets))]
    picks = rng.choices(range(len(tool_sets)), weights=weights, k=n)
    return [dict(make_example(rng, tool_sets[i]), _set=i) for i in picks]


def make_rows_own_tools(rng, n):
    """Rows that each carry a tool set of their own (a fresh draw of domain, tools, their order and
    descriptions), as a dataset gathered from many apps: no two rows share a tools prompt."""
    return [dict(make_example(rng, make_tool_sets(rng, 1)[0]), _set=-1) for _ in range(n)]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            r = {k: v for k, v in r.items() if not k.startswith("_")}
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# Tokenizer and checkpoint (the reference's code)
# --------------------------------------------------------------------------------------------

FIXTURES = os.path.join(REPO, "tests", "fixtures")
sys.path.insert(0, FIXTURES)

# Each generation's released shape scaled down: Needle 2's (768 wide, 27 layers, 12/6 heads, engram
# at 2 and 15, 8192 slots) and Needle 3's (768 wide, 20 layers, 12/2 heads of q/k 48 and v 64, a
# 1024-token window with every fifth layer global and the last one too, engram at every fourth layer
# ending at the last, 18432 slots, 4096 positions).
SHAPES = {
    2: dict(d_model=256, num_layers=6, num_heads=4, num_kv_heads=2, mhc_lanes=4, engram_layers=(2,),
            engram_slots=2048, contrastive_dim=64, max_seq_len=2048),
    3: dict(d_model=256, num_layers=6, num_heads=4, num_kv_heads=2, qk_head_dim=48, v_head_dim=64,
            mhc_lanes=4, engram_layers=(2, 5), engram_slots=4608, global_layers=(2, 5), sliding_window=512,
            qkv_conv_taps=3, max_seq_len=2048),
}
# Shape flags (argparse's names) and the config fields they set; a flag the generation's config
# lacks is refused.
SHAPE_FLAGS = {"d_model": "d_model", "layers": "num_layers", "heads": "num_heads", "kv_heads": "num_kv_heads",
               "mhc_lanes": "mhc_lanes", "engram_layers": "engram_layers", "engram_slots": "engram_slots",
               "max_seq_len": "max_seq_len", "contrastive_dim": "contrastive_dim", "qk_head_dim": "qk_head_dim",
               "v_head_dim": "v_head_dim", "global_layers": "global_layers", "sliding_window": "sliding_window",
               "qkv_conv_taps": "qkv_conv_taps"}
BASE_NAMES = {2: "base.pkl", 3: "base.safetensors"}


def layer_list(text):
    return tuple(int(x) for x in text.split(",") if x.strip())


def package_generation():
    """(generation, version) of the cactus-needle this python has."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        v = version("cactus-needle")
    except PackageNotFoundError:
        raise SystemExit(f"{sys.executable} has no cactus-needle: run make_inputs.py with the python of the "
                         "generation's venv (tests/fixtures/regen.sh makes them; the side-by-side script's --python)")
    return int(v.split(".")[0]), v


def model_shape(args, vocab):
    shape = dict(SHAPES[args.generation])
    for flag, field in SHAPE_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if field not in shape:
            raise SystemExit(f"--{flag.replace('_', '-')}: a Needle {args.generation} model has no {field} "
                             f"(its shape flags set {', '.join(sorted(shape))})")
        shape[field] = value
    return dict(shape, vocab_size=vocab, dtype="float32")

def train_tokenizer(rows, vocab, path):
    from needle.model import finetune
    from needle.model.tokenizer import CHAT_MARKERS
    from fixture_common import train_bpe
    train_bpe(["".join(finetune.render_example(r)) for r in rows], path, vocab, CHAT_MARKERS)


def make_checkpoint(generation, path, shape, seed, perturb):
    """(parameter count, perturbed leaves) of the generation's random-init base written to `path`."""
    if generation == 3:
        from make_needle3_fixtures import write_seeded_checkpoint
        count, touched = write_seeded_checkpoint(path, shape, seed, heads=True, name="bench-finetune-random-init",
                                                 perturb=perturb)
        return int(count), len(touched)
    return make_needle2_checkpoint(path, shape, seed, perturb)


def make_needle2_checkpoint(path, shape, seed, perturb):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from needle.model.architecture import SimpleAttentionNetwork, TransformerConfig
    from needle.model.run import CHECKPOINT_FORMAT_VERSION
    from fixture_common import config_dict, perturb_constant_leaves

    config = TransformerConfig(**shape)
    model = SimpleAttentionNetwork(config)

    def touch_everything(module, tokens):
        module(tokens)
        module.forward_contrastive(tokens, tokens)
        module.forward_confidence(tokens)

    tokens = jnp.ones((1, 16), jnp.int32)
    variables = jax.jit(lambda key: model.init(key, tokens, method=touch_everything))(jax.random.PRNGKey(seed))
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), dict(variables["params"]))
    touched = []
    if perturb:
        params, touched = perturb_constant_leaves(params, seed + 1)
    with open(path, "wb") as f:
        pickle.dump({"format_version": CHECKPOINT_FORMAT_VERSION, "params": params, "config": config_dict(config),
                     "step": 0, "run": {"name": "bench-finetune-random-init", "seed": seed,
                                        "perturbed": touched}}, f)
    return int(sum(a.size for a in jax.tree.leaves(params))), len(touched)


# --------------------------------------------------------------------------------------------

def token_stats(rows, tok):
    from needle.model import finetune
    lens, prompt_lens = [], []
    for r in rows:
        prompt, target = finetune.render_example(r)
        p = len(tok.encode(prompt))
        prompt_lens.append(p)
        lens.append(p + len(tok.encode(target)) + 2)
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]
    return {"rows": len(rows), "seq_min": min(lens), "seq_median": q(lens, 0.5), "seq_p90": q(lens, 0.9),
            "seq_max": max(lens), "seq_mean": round(statistics.mean(lens), 1),
            "prompt_min": min(prompt_lens), "prompt_max": max(prompt_lens),
            "prompt_mean": round(statistics.mean(prompt_lens), 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--examples", type=int, default=160, help="rows of train.jsonl")
    ap.add_argument("--test-examples", type=int, default=40, help="rows of test.jsonl")
    ap.add_argument("--tool-sets", type=int, default=8, help=f"distinct tool prompts (1-{len(DOMAINS)})")
    ap.add_argument("--tools-per-row", action="store_true",
                    help="every row carries its own tool set (ignores --tool-sets): nothing shared")
    ap.add_argument("--generation", type=int, choices=sorted(SHAPES), default=3,
                    help="the model generation (default 3); this python's cactus-needle must be of it")
    shape = ap.add_argument_group("model shape", "[default: the generation's scaled-down released shape, SHAPES]")
    for flag in ("d-model", "layers", "heads", "kv-heads", "mhc-lanes", "engram-slots", "max-seq-len",
                 "contrastive-dim", "qk-head-dim", "v-head-dim", "sliding-window", "qkv-conv-taps"):
        shape.add_argument(f"--{flag}", type=int)
    for flag in ("engram-layers", "global-layers"):
        shape.add_argument(f"--{flag}", type=layer_list, help="comma-separated layer indices")
    ap.add_argument("--vocab", type=int, default=2048,
                    help="N: train a BPE of N pieces on train.jsonl (default 2048); 0: copy the fixture "
                         "tokenizer (vocab 512, ~1.9 characters per token: prompts become 3-4x longer)")
    ap.add_argument("--no-perturb", action="store_true", help="keep the constant-initialised leaves as init")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    generation, version = package_generation()
    if generation != args.generation:
        raise SystemExit(f"--generation {args.generation}: {sys.executable} has cactus-needle {version} (Needle "
                         f"{generation}); run make_inputs.py with the python of a Needle {args.generation} venv")
    if not args.vocab and generation != 2:
        raise SystemExit(f"--vocab 0 copies {FIXTURE_TOKENIZER}, a Needle 2 tokenizer: give a vocabulary size")
    from needle.model.tokenizer import SANTokenizer

    os.makedirs(args.outdir, exist_ok=True)
    rng = random.Random(args.seed)
    if args.tools_per_row:
        tool_sets = []
        train = make_rows_own_tools(rng, args.examples)
        test = make_rows_own_tools(rng, args.test_examples)
    else:
        tool_sets = make_tool_sets(rng, args.tool_sets)
        train = make_rows(rng, tool_sets, args.examples)
        test = make_rows(rng, tool_sets, args.test_examples)
    write_jsonl(os.path.join(args.outdir, "train.jsonl"), train)
    write_jsonl(os.path.join(args.outdir, "test.jsonl"), test)

    tok_path = os.path.join(args.outdir, "tokenizer.model")
    if args.vocab:
        # A small dataset (one app's few rows) has too little text for the vocabulary: the
        # tokenizer also learns from rows of other tool sets (a separate seed; not written).
        extra = make_rows_own_tools(random.Random(args.seed + 7), max(0, 160 - len(train)))
        train_tokenizer(train + extra, args.vocab, tok_path)
    else:
        shutil.copyfile(FIXTURE_TOKENIZER, tok_path)
    tok = SANTokenizer(tok_path)

    shape = model_shape(args, tok.vocab_size)
    base = BASE_NAMES[generation]
    n_params, n_touched = make_checkpoint(generation, os.path.join(args.outdir, base), shape, args.seed + 100,
                                          not args.no_perturb)

    per_set = [sum(r["_set"] == i for r in train) for i in range(len(tool_sets))]
    info = {
        "generation": generation,
        "package": f"cactus-needle {version}",
        "base": base,
        "tokenizer": {"source": f"trained, vocab {args.vocab}" if args.vocab else FIXTURE_TOKENIZER,
                      "vocab": tok.vocab_size},
        "checkpoint": dict(shape, params=n_params, perturbed_leaves=n_touched),
        "tool_sets": [{"domain": s["domain"], "tools": len(s["schemas"]), "train_rows": per_set[i]}
                      for i, s in enumerate(tool_sets)] if tool_sets else "one per row",
        "train": token_stats(train, tok),
        "test": token_stats(test, tok),
    }
    with open(os.path.join(args.outdir, "inputs.json"), "w") as f:
        json.dump(info, f, indent=1)
    t = info["train"]
    print(f"[make_inputs] {args.outdir}: train {t['rows']} rows (seq {t['seq_min']}..{t['seq_max']}, "
          f"median {t['seq_median']}, prompt {t['prompt_min']}..{t['prompt_max']} tokens), "
          f"test {info['test']['rows']} rows, "
          f"{f'{len(tool_sets)} tool sets {per_set}' if tool_sets else 'a tool set per row'}, "
          f"vocab {tok.vocab_size}, Needle {generation} checkpoint {base} {n_params / 1e6:.2f}M params",
          flush=True)


if __name__ == "__main__":
    main()
