"""The record and the report of bench/demo_table.sh, from the files it keeps in RESULTS.

    python3 bench/demo/report.py meta RESULTS COMMANDS.tsv --date D --commit C --cpu NAME --cores N \
        --dirty N --load "L1 L5 L15"
    python3 bench/demo/report.py table RESULTS
    python3 bench/demo/report.py confidence RESULTS

`meta` writes RESULTS/meta.json: the date, commit, CPU and load, and each command as run (its results
file, argv, wall seconds) from COMMANDS.tsv (name, seconds, command line; tab-separated).
`table` prints the README's demo table rows (markdown) for the generations RESULTS holds, then the
figures its paragraphs quote: the fine-tune's own held-out report, eval's three rows of the tuned
model, and the suite at the 0.4 gate. `confidence` (a run with --confidence) prints the held-out
reliability of each model's confidence: AUROC and ECE with their 90% intervals, and the trade-off at
the threshold eval proposes. A file missing or unreadable is an error naming it.
"""
import argparse
import json
import os
import shlex
import sys

# The suite's categories in the README's column order.
CATEGORIES = ["positive", "missing", "irrelevant", "negation", "invalid", "parallel"]
MODELS = [("base", "base"), ("tuned", "tuned"), ("cact", "`.cact` (the file's weights, run by Needle Studio)")]


def fail(message):
    sys.exit(f"report.py: {message}")


def last_json_line(path):
    """The last line of PATH that is a JSON object (eval and suite print one; events, many)."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.startswith("{")]
        return json.loads(lines[-1])
    except (OSError, ValueError, IndexError) as error:
        fail(f"{path}: no JSON line to read ({error}); run bench/demo_table.sh again")


def finished_event(path):
    """The fine-tune's `finished` event, which carries its held-out report."""
    try:
        with open(path) as f:
            events = [json.loads(line) for line in f if line.startswith("{")]
    except (OSError, ValueError) as error:
        fail(f"{path}: not JSON events ({error}); run bench/demo_table.sh again")
    finished = [event for event in events if event.get("event") == "finished"]
    if not finished:
        fail(f"{path}: the fine-tune has no finished event; its run did not end")
    return finished[-1]


def calls_cells(loss, calls):
    """Held-out loss, exact calls with their share, and the share of answers that parse."""
    return [f"{loss:.3f}", f"{calls['exact']} ({calls['exact_rate']:.0%})", f"{calls['parse_rate']:.0%}"]


def suite_cells(report):
    """Cases passed, passed per category, critical cases failed."""
    passed = {category: 0 for category in CATEGORIES}
    for case in report["cases"]:
        passed[case["category"]] += bool(case["pass"])
    per_category = " / ".join(str(passed[category]) for category in CATEGORIES)
    return [str(report["passed"]), per_category, str(report["critical_failures"])]


def generations(results):
    found = [g for g in ("2", "3") if os.path.exists(os.path.join(results, f"n{g}-eval-tuned.json"))]
    if not found:
        fail(f"{results}: no n2-/n3-eval-tuned.json; is this a bench/demo_table.sh results folder?")
    return found


def table(results):
    read = lambda name: last_json_line(os.path.join(results, name))
    rows, notes = [], []
    for g in generations(results):
        base = read(f"n{g}-eval-base.json")
        quant = read(f"n{g}-eval-tuned.json")["quant_rows"]
        scores = {"base": (base["loss"], base["accuracy"]),
                  "tuned": (quant["float"]["loss"], quant["float"]["calls"]),
                  "cact": (quant["cact"]["loss"], quant["cact"]["calls"])}
        for key, label in MODELS:
            if g == "3" and key == "tuned":
                label = "tuned (trained through its W4 weights)"
            cells = calls_cells(*scores[key]) + suite_cells(read(f"n{g}-suite-{key}.json"))
            rows.append(f"| Needle {g} {label} | " + " | ".join(cells) + " |")
        run = finished_event(os.path.join(results, f"n{g}-finetune.jsonl"))["accuracy"]
        held = run["tuned"]["calls"]["examples"]
        notes.append(f"Needle {g}: the fine-tune's own report, base {run['base']['calls']['exact']} / {held}, "
                     f"tuned {run['tuned']['calls']['exact']} / {held}; eval --quant-rows, float "
                     f"{quant['float']['calls']['exact']}, simulated {quant['simulated']['calls']['exact']}, "
                     f".cact {quant['cact']['calls']['exact']}")
        gated = [(key, read(f"n{g}-suite-{key}-gate0.4.json")) for key, _ in MODELS]
        notes.append(f"Needle {g} at the 0.4 gate: " + ", ".join(
            f"{key} {r['passed']} / {r['total']} with {r['critical_failures']} critical failed" for key, r in gated))
    print("| | held-out loss | exact calls (60 held out) | answers that parse | suite (32) "
          "| positive / missing / irrelevant / negation / invalid / parallel | critical failed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print()
    print("\n".join(notes))


# The confidence rows: the label, the results file, and where its reliability sits in it.
CONFIDENCE_ROWS = [
    ("base, decode probability", "eval-base.json", ("accuracy",)),
    ("tuned, min(head, decode)", "eval-tuned.json", ("quant_rows", "float", "calls")),
    ("tuned, decode probability alone", "eval-tuned-decode.json", ("accuracy",)),
    ("`.cact`, min(head it carries, decode)", "eval-tuned.json", ("quant_rows", "cact", "calls")),
]


def confidence(results):
    read = lambda name: last_json_line(os.path.join(results, name))
    found = [g for g in ("2", "3") if os.path.exists(os.path.join(results, f"n{g}-eval-tuned-decode.json"))]
    if not found:
        fail(f"{results}: no n2-/n3-eval-tuned-decode.json; run bench/demo_table.sh --confidence (a fine-tune "
             "that wrote no head, its answers all right or all wrong, has none)")
    interval = lambda i: f"[{i['low']:.3f}, {i['high']:.3f}]" if i else "n/a"
    print("| | answers (right) | AUROC [90%] | ECE [90%] | proposed threshold | right kept | wrong stopped |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for g in found:
        for label, name, path in CONFIDENCE_ROWS:
            figures = read(f"n{g}-{name}")
            for key in path:
                figures = figures.get(key) or {}
            figures = figures.get("confidence")
            if not figures:
                fail(f"{os.path.join(results, f'n{g}-{name}')}: no confidence figures under {'.'.join(path)}")
            at = next(t for t in figures["tradeoff"] if abs(t["threshold"] - figures["proposed"]) < 1e-9)
            share = lambda value: "n/a" if value is None else f"{value:.0%}"
            auroc = "n/a" if figures["auroc"] is None else f"{figures['auroc']:.3f}"
            print(f"| Needle {g} {label} | {figures['answers']} ({figures['right']}) "
                  f"| {auroc} {interval(figures['auroc_interval'])} "
                  f"| {figures['ece']:.3f} {interval(figures['ece_interval'])} | {figures['proposed']:.2f} "
                  f"| {share(at['kept_right'])} | {share(at['stopped_wrong'])} |")


def meta(args):
    commands = []
    with open(args.commands) as f:
        for line in f:
            name, seconds, command = line.rstrip("\n").split("\t")
            commands.append({"output": name, "argv": shlex.split(command), "wall_s": float(seconds)})
    record = {
        "script": "bench/demo_table.sh",
        "date": args.date,
        "commit": args.commit,
        "uncommitted_changes": int(args.dirty) > 0,
        "cpu": args.cpu,
        "cores": int(args.cores),
        "load_at_start": args.load,
        "note": "wall_s is indicative only: other processes may have shared the CPU (load_at_start)",
        "commands": commands,
    }
    with open(os.path.join(args.results, "meta.json"), "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("meta")
    m.add_argument("results")
    m.add_argument("commands")
    for flag in ("--date", "--commit", "--cpu", "--cores", "--dirty", "--load"):
        m.add_argument(flag, required=True)
    for what in ("table", "confidence"):
        sub.add_parser(what).add_argument("results")
    args = parser.parse_args()
    {"meta": meta, "table": lambda a: table(a.results), "confidence": lambda a: confidence(a.results)}[args.what](args)


if __name__ == "__main__":
    main()
