"""Prints the side-by-side table of bench/finetune_side_by_side.sh from the files of one run.

    python3 bench/finetune/report.py WORKDIR

Reads WORKDIR/{ours,ref}.time (`/usr/bin/time -f '%e %M'`: wall seconds, peak RSS KiB),
ours.events (`needle finetune --events jsonl`), ours.rc / ref.rc, ours.load / ref.load, ref.json (the reference's own
timing report), score_test.json and, if present, score_train.json (reference_finetune.py score),
and settings.json (its generation names the reference and the adapters' extension). Writes
WORKDIR/summary.json as well.
"""
import json
import os
import sys


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def read_json(path):
    text = read(path)
    return json.loads(text) if text else None


def time_file(path):
    """(wall_s, peak_rss_mb) from /usr/bin/time -f '%e %M' -o PATH; last line wins (the file also
    gets 'Command exited with non-zero status N' or 'Command terminated by signal N')."""
    text = read(path)
    if not text:
        return None, None
    for line in reversed(text.strip().splitlines()):
        parts = line.split()
        if len(parts) == 2:
            try:
                return float(parts[0]), float(parts[1]) / 1024.0
            except ValueError:
                pass
    return None, None


def ours_events(path):
    out = {"steps": None, "last_loss": None, "val_loss": None, "train_s": None, "total_steps": None}
    for line in (read(path, "") or "").splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = e.get("event")
        if kind == "started":
            out["total_steps"] = e.get("steps")
            out["seq_len"] = e.get("seq_len")
            out["memory_estimate_mb"] = round(e.get("memory_estimate_bytes", 0) / 2**20, 1)
        elif kind == "step":
            out["steps"] = e["step"]
            out["last_loss"] = e["loss"]
            out["tokens_per_s"] = e.get("tokens_per_s")
        elif kind == "epoch":
            out["last_loss"] = e.get("loss")
            out["val_loss"] = e.get("val")
        elif kind == "finished":
            out["train_s"] = e.get("seconds")
            out["partial"] = e.get("partial")
            calls = ((e.get("accuracy") or {}).get("tuned") or {}).get("calls")
            if calls:
                out["accuracy"] = f"{calls['exact']}/{calls['examples']}"
        elif kind == "failed":
            out["failed"] = e.get("message")
    return out


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    work = sys.argv[1]
    p = lambda name: os.path.join(work, name)
    settings = read_json(p("settings.json")) or {}
    ours_wall, ours_rss = time_file(p("ours.time"))
    ref_wall, ref_rss = time_file(p("ref.time"))
    ours_rc = (read(p("ours.rc"), "") or "").strip() or None
    ref_rc = (read(p("ref.rc"), "") or "").strip() or None
    ev = ours_events(p("ours.events"))
    ref = read_json(p("ref.json")) or {}
    scores = {k: read_json(p(f"score_{k}.json")) for k in ("test", "train")}
    ext = settings.get("adapter_ext", "pkl")
    ours_adapter, ref_adapter = p(f"ours.{ext}"), p(f"ref.{ext}")
    reference = settings.get("reference", "reference")

    def scored(which, adapter):
        s = scores.get(which)
        if not s:
            return None
        hit = s["adapters"].get(adapter)
        return hit["loss"] if hit else None

    rows = [
        ("exit status", ours_rc, ref_rc, None, "s"),
        ("wall s (whole process)", ours_wall, ref_wall, ".1f", "time"),
        ("peak RSS MB", ours_rss, ref_rss, ".0f", "mem"),
        ("train s (steps + val)", ev["train_s"], ref.get("train_val_s"), ".1f", "time"),
        ("steps done", ev["steps"], ref.get("steps") if ref_rc == "0" else None, "d", None),
        ("last train-step loss", ev["last_loss"], ref.get("last_loss"), ".4f", "loss"),
        ("own val loss (own split)", ev["val_loss"], ref.get("val_loss"), ".4f", "loss"),
    ]
    if ev.get("accuracy") or ref.get("accuracy"):
        rows.append(("held-out calls exact (own)", ev.get("accuracy"), ref.get("accuracy"), "s", None))
    for which in ("test", "train"):
        s = scores.get(which)
        if s:
            rows.append((f"ref-scored {which} loss", scored(which, ours_adapter), scored(which, ref_adapter),
                         ".4f", "loss"))

    print()
    print(f"  Needle {settings.get('generation', 2)}: ours vs {reference}")
    print(f"  settings: {json.dumps(settings)}")
    nproc = os.cpu_count()
    loads = {k: (read(p(f"{k}.load"), "") or "").strip() for k in ("ours", "ref")}
    print(f"  machine: {nproc} CPUs; load average (1/5/15 min) before ours: {loads['ours'] or '-'}, "
          f"before reference: {loads['ref'] or '-'}")
    summary_load = loads
    if ref:
        print(f"  reference breakdown: setup {ref.get('setup_s')} s, first step (incl. jit) "
              f"{ref.get('first_step_s')} s, per later step {ref.get('per_step_s')} s, "
              f"after the last step (val, 3.x's held-out scoring, save) {ref.get('finish_s')} s"
              + (f", of which its held-out scoring {ref['scoring_s']} s" if ref.get("scoring_s") is not None else ""))
    if ev.get("train_s") is not None:
        print(f"  ours: steps + val {ev['train_s']:.1f} s (its held-out scoring follows), "
              f"{fmt(ev.get('tokens_per_s'), '.0f')} padded tokens/s, "
              f"plan estimate {ev.get('memory_estimate_mb')} MiB")
    if ev.get("failed"):
        print(f"  ours failed: {ev['failed']}")
    for which in ("test", "train"):
        s = scores.get(which)
        if s:
            print(f"  {which}: {s['examples']} examples, {s['answer_tokens']} answer tokens, seq_len "
                  f"{s['seq_len']}, scored {s.get('numerics', 'as stored')} by {reference}, "
                  f"base (no adapter) loss {s['base']:.4f}")
    print()
    head = f"  {'':<28} {'ours':>12} {'reference':>12} {'ours/ref':>10} {'ours-ref':>10}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    summary = {"settings": settings, "cpus": nproc, "load_before": summary_load, "rows": {}}
    both_ok = ours_rc == "0" and ref_rc == "0"
    for label, o, r, spec, kind in rows:
        rat = diff = ""
        if kind in ("time", "mem") and both_ok:
            rr = ratio(o, r)
            rat = "" if rr is None else f"{rr:.2f}x"
        if kind == "loss" and both_ok and o is not None and r is not None:
            diff = f"{o - r:+.4f}"
        if spec == "s" or spec is None:
            os_, rs = ("-" if o is None else str(o)), ("-" if r is None else str(r))
        else:
            os_, rs = fmt(o, spec), fmt(r, spec)
        print(f"  {label:<28} {os_:>12} {rs:>12} {rat:>10} {diff:>10}")
        summary["rows"][label] = {"ours": o, "reference": r}
    for name, rc, log in (("ours", ours_rc, "ours.err"), ("reference", ref_rc, "ref.log")):
        if rc not in (None, "0"):
            why = {"124": "killed by the timeout", "134": "aborted (e.g. a failed allocation under ulimit -v)",
                   "137": "killed (SIGKILL, e.g. the OOM killer)"}.get(rc, "failed")
            print(f"\n  {name} did NOT finish: exit {rc}, {why}; its figures above are up to that point "
                  f"(see {log})")
    if both_ok and ours_wall and ref_wall:
        print(f"\n  speed: ours is {ref_wall / ours_wall:.2f}x the reference's speed "
              f"(wall {ours_wall:.1f} s vs {ref_wall:.1f} s)")
    ours_train, ref_train = ev.get("train_s"), ref.get("train_val_s")
    if both_ok and ours_train and ref_train:
        print(f"         steps + validation alone: {ref_train / ours_train:.2f}x ({ours_train:.1f} s vs {ref_train:.1f} s)")
    if both_ok and ours_rss and ref_rss:
        print(f"  memory: ours peaks at {ours_rss / ref_rss:.2f}x the reference's RSS "
              f"({ours_rss:.0f} MB vs {ref_rss:.0f} MB)")
    with open(p("summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
