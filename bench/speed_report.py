"""The README's Benchmarks tables from the raw output bench/record.sh keeps in RESULTS.

    python3 bench/speed_report.py RESULTS

Prints two markdown tables: training (each step shape and the whole fine-tune, ours beside the
reference's, with the ratio of their times) and decoding (each shape and precision of `needle bench
--decode`). Every figure comes from a file of RESULTS; a run that is missing, failed or was skipped is
an error naming it, so a table is never printed from half a record.
"""
import json
import os
import sys

STEPS = [("needle", "Needle 2 shape, batch 4 × 128 (`--preset needle`)"),
         ("needle3", "released Needle 3 shape, batch 4 × 128 (`--preset needle3`)")]
FINETUNE = ("finetune-needle3-one-app",
            "whole `needle finetune`, Needle 3 (`finetune_side_by_side.sh --kind one-app`): one app's 27 rows, 6 epochs")
DECODE = [("needle3", "released Needle 3"), ("needle2", "released Needle 2")]


def fail(message):
    sys.exit(f"speed_report.py: {message}; run bench/record.sh again")


def runs(results):
    """bench/record.sh's runs.jsonl by run name."""
    path = os.path.join(results, "runs.jsonl")
    try:
        with open(path) as f:
            return {run["run"]: run for run in map(json.loads, f)}
    except (OSError, ValueError) as error:
        fail(f"{path}: {error}")


def output(results, recorded, name):
    """The last JSON line run NAME printed; an error when it was skipped, failed or left none."""
    run = recorded.get(name)
    if run is None:
        fail(f"{results}: no run {name} in runs.jsonl")
    if "skipped" in run:
        fail(f"{results}: {name} was skipped ({run['skipped']})")
    if run["exit"] != 0:
        fail(f"{results}: {name} exited {run['exit']} (see {run['output']}.log)")
    path = os.path.join(results, run["output"])
    try:
        with open(path) as f:
            return json.loads([line for line in f if line.startswith("{")][-1])
    except (OSError, ValueError, IndexError) as error:
        fail(f"{path}: no JSON line ({error})")


def step_cell(line):
    return f"{line['step_s']:.2f} s/step, first step {line['first_step_s']:.1f} s, {line['peak_rss_mb'] / 1000:.2f} GB"


def training(results, recorded):
    rows = ["| | `needle` | reference | |", "| --- | --- | --- | --- |"]
    for preset, label in STEPS:
        ours = output(results, recorded, f"step-{preset}-ours")
        ref = output(results, recorded, f"step-{preset}-reference")
        rows.append(f"| {label} | {step_cell(ours)} | {step_cell(ref)} | {ref['step_s'] / ours['step_s']:.1f}× |")
    name, label = FINETUNE
    output_file = os.path.join(results, name, "summary.json")
    try:
        with open(output_file) as f:
            summary = json.load(f)["rows"]
        wall, rss = summary["wall s (whole process)"], summary["peak RSS MB"]
    except (OSError, ValueError, KeyError) as error:
        fail(f"{output_file}: {error}")
    if None in (wall["ours"], wall["reference"], rss["ours"], rss["reference"]):
        fail(f"{output_file}: a side of the whole run has no time or memory")
    cell = lambda side: f"{wall[side]:.1f} s, {rss[side] / 1000:.2f} GB"
    rows.append(f"| {label} | {cell('ours')} | {cell('reference')} | {wall['reference'] / wall['ours']:.1f}× |")
    return rows


def decoding(results, recorded):
    rows = ["| shape, 256-token prompt, 32 new tokens | precision | prompt + first token | whole turn "
            "| tokens/s, one stream | rows/s, 16 rows | peak memory |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for preset, label in DECODE:
        line = output(results, recorded, f"decode-{preset}")
        for figures in line["precisions"]:
            precision = figures["precision"]
            # Each precision run alone has a peak of its own (run together, the peak is the largest's);
            # bench/record.sh runs them alone at the Needle 3 shape.
            memory = "-"
            if preset == "needle3":
                alone = output(results, recorded, f"decode-{preset}-{precision}-alone")
                memory = f"{alone['precisions'][0]['peak_rss_mb']:.0f} MB"
            rows.append(f"| {label} | {precision} | {figures['prefill_s'] * 1000:.0f} ms | {figures['turn_s'] * 1000:.0f} ms "
                        f"| {figures['decode_tokens_per_s']:.0f} | {figures['rows_per_s']:.1f} | {memory} |")
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    results = sys.argv[1]
    recorded = runs(results)
    print("\n".join(training(results, recorded)))
    print()
    print("\n".join(decoding(results, recorded)))


if __name__ == "__main__":
    main()
