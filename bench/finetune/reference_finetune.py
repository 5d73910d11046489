"""The reference side of the fine-tuning benchmarks (bench/finetune_side_by_side.sh and
bench/calls_side_by_side.sh), for either generation: run it with the python of the generation's
reference, cactus-needle 2.0.8 (Needle 2: `.pkl` checkpoints and adapters) or 3.2.8 (Needle 3:
`.safetensors` checkpoints and adapters, trained and scored quantization-aware).

    # train: the reference's own finetune_local (what `needle finetune` runs), timed
    PYTHON bench/finetune/reference_finetune.py train DATA --checkpoint CKPT --tokenizer TOK \\
        [--epochs 1] [--batch-size 16] [--lr 1e-4] [--lora-rank 16] [--lora-alpha 32] \\
        [--max-len 1024] [--val-split 0.1] [--seed 0] --out ADAPTER [--report REPORT.json]

    # build: merge an adapter and export a .cact with the reference's build_main (its `needle build`)
    python3 bench/finetune/reference_finetune.py build CKPT --lora ADAPTER.pkl --tokenizer TOK \\
        [--bits 4] --out TUNED.cact

    # score: the reference's masked answer loss of base (+ each adapter) over a whole dataset
    python3 bench/finetune/reference_finetune.py score DATA --checkpoint CKPT --tokenizer TOK \\
        [--max-len 1024] [--batch 8] [ADAPTER.pkl ...] [--report SCORES.json]

`train` calls needle.model.finetune.finetune_local with the same argument object the reference
CLI builds (`needle finetune`), with one patch: finetune_local loads its tokenizer with
get_tokenizer(), which downloads from the Hugging Face hub; here that name is rebound to load
--tokenizer instead. 3.2.8's finetune_local ends with its own scoring (exact calls of the held-out
split, decoded through the W4 weights) before it saves; that is part of its run, as the end-of-run
scoring is part of ours. It prints the reference's own progress lines, then one line
`[reference] {...}` with wall seconds (whole process, imports included; and split into setup,
first step incl. jit compile, remaining steps), peak RSS (getrusage ru_maxrss) and the last step
and validation losses it printed (and 3.2.8's held-out accuracy). 2.0.8 shuffles with the NumPy
global seed, which is set to --seed, so the per-epoch shuffles (np.random.permutation) are
reproducible; the validation split and the LoRA init are already seeded (default_rng(0),
PRNGKey(0)) inside finetune_local. 3.2.8 takes --seed itself (args.seed: default_rng(seed) for the
split and the shuffles, PRNGKey(seed) for the LoRA init).

`score` computes exactly finetune_local's loss_fn: logits of the model with merge_lora(params,
lora, scale) applied, shifted cross-entropy, weighted by the answer mask (mask[:, 1:]), but
summed over every example of DATA and divided by the total number of answer tokens (one
token-weighted mean over the whole file, not a mean of batch means). Under 3.2.8 that loss is
its quantization-aware one, as it trains: the merged weights through CQ W4 (straight-through) and
the model applied with quant=True after configure_deploy(act_bits, kv_bits); the base is scored
the same way. Rows are encoded with the reference's fit_max_len / load_jsonl under --max-len.
Adapters are files in the format finetune_local writes: 2.0.8's `.pkl` (`{"lora": {"a/b/kernel":
{"A", "B"}}, "scale", "base", "rank"}`) or 3.2.8's `.safetensors` (read by its read_adapter), which
our `needle finetune --out X.pkl|X.safetensors` writes too. JAX runs on CPU (JAX_PLATFORMS=cpu
unless set).
"""
import argparse
import json
import os
import resource
import sys
import time

T0 = time.time()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def package_generation():
    """The generation of the installed cactus-needle: 2 (2.0.x) or 3 (3.2.x)."""
    from importlib.metadata import version
    return int(version("cactus-needle").split(".")[0])


def peak_rss_mb():
    # Linux reports ru_maxrss in KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def use_tokenizer(path):
    """Rebind the reference's get_tokenizer (a hub download) to our tokenizer.model."""
    from needle.model import finetune, tokenizer
    from needle.model.tokenizer import SANTokenizer
    tok = SANTokenizer(path)

    def get_tokenizer(vocab_size=None, *args, **kwargs):
        if vocab_size is not None and vocab_size != tok.vocab_size:
            raise SystemExit(f"checkpoint vocab {vocab_size} != tokenizer vocab {tok.vocab_size} ({path})")
        return tok

    finetune.get_tokenizer = get_tokenizer
    tokenizer.get_tokenizer = get_tokenizer
    return tok


def write_report(path, obj):
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")


# --------------------------------------------------------------------------------------------

def train(args):
    import numpy as np
    from needle.model import finetune
    use_tokenizer(args.tokenizer)
    np.random.seed(args.seed)
    t_imported = time.time()

    ft_args = argparse.Namespace(
        jsonl_path=args.data, checkpoint=args.checkpoint, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, max_len=args.max_len,
        val_split=args.val_split, generate=0, model=None, workers=1, seed=args.seed,
        checkpoint_dir=os.path.dirname(os.path.abspath(args.out)), out=args.out)

    events = []   # (seconds since start, message) for every progress line finetune_local emits

    def progress(msg):
        events.append((time.time(), msg))

    started = time.time()
    finetune.finetune_local(ft_args, progress=progress)
    finished = time.time()

    steps = [(t, m) for t, m in events if m.strip().startswith("step")]
    last_loss = val = accuracy = None
    for _, m in events:
        words = m.split()
        if words and words[0] == "accuracy":   # 3.2.8: "accuracy C/T held-out calls exact, ..."
            accuracy = words[1]
        if words and words[0] == "step":
            last_loss = float(words[words.index("loss") + 1])
        if words and words[0] == "epoch":
            last_loss = float(words[words.index("loss") + 1])
            if "val" in words:
                val = float(words[words.index("val") + 1])
    schedule = next((t for t, m in events if m.strip().startswith("schedule")), started)
    epochs = [t for t, m in events if m.strip().startswith("epoch")]
    scored = next((t for t, m in events if m.strip().startswith("accuracy")), None)
    total_steps = None
    for _, m in events:
        if m.strip().startswith("schedule"):
            total_steps = int(m.split()[1])
    report = {
        "impl": "reference",
        "wall_s": round(finished - T0, 3),
        "import_s": round(t_imported - T0, 3),
        "setup_s": round(schedule - started, 3),             # load checkpoint, tokenize, init LoRA
        "steps": total_steps,
        "logged_steps": len(steps),
        "first_step_s": round(steps[0][0] - schedule, 3) if steps else None,   # incl. jit compile
        "rest_steps_s": round(steps[-1][0] - steps[0][0], 3) if len(steps) > 1 else None,
        "per_step_s": (round((steps[-1][0] - steps[0][0]) / (len(steps) - 1), 3)
                       if len(steps) > 1 and len(steps) == total_steps else None),
        "train_loop_s": round((steps[-1][0] if steps else finished) - schedule, 3),
        "finish_s": round(finished - (steps[-1][0] if steps else schedule), 3),   # val (+ 3.2.8's scoring) + save
        # every epoch's steps and validation, as ours' `finished` seconds count them
        "train_val_s": round(epochs[-1] - schedule, 3) if epochs else None,
        # 3.2.8's end-of-run scoring: from the last epoch's line to its accuracy line
        "scoring_s": round(scored - epochs[-1], 3) if scored and epochs else None,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "last_loss": last_loss,
        "val_loss": val,
        "accuracy": accuracy,
        "adapter": args.out,
    }
    print("[reference] " + json.dumps(report), flush=True)
    write_report(args.report, report)


# --------------------------------------------------------------------------------------------

def build(args):
    from needle.model import finetune
    use_tokenizer(args.tokenizer)
    # build_main reads checkpoint, lora, bits (a string, as argparse gives it), out, upload
    finetune.build_main(argparse.Namespace(checkpoint=args.checkpoint, lora=args.lora,
                                           bits=str(args.bits), out=args.out, upload=False))


# --------------------------------------------------------------------------------------------

def load_adapter(path):
    import pickle
    import jax.numpy as jnp
    if path.endswith(".safetensors"):
        from needle.model.checkpoints import read_adapter   # 3.x only: its adapters are safetensors
        adapter = read_adapter(path)
    else:
        with open(path, "rb") as f:
            adapter = pickle.load(f)
    lora = {tuple(key.split("/")): {"A": jnp.asarray(v["A"], jnp.float32), "B": jnp.asarray(v["B"], jnp.float32)}
            for key, v in adapter["lora"].items()}
    return lora, float(adapter["scale"]), adapter.get("rank")


def training_numerics(config):
    """(weights, apply_args, name): how finetune_local runs the model in its loss. 2.0.8: the
    weights as they are. 3.2.8: quantization-aware, the weights through CQ W4 with a straight-through
    gradient and the model applied with quant=True (A8 activations, 8-bit queries and KV) after
    configure_deploy, as its loss_fn does."""
    if package_generation() == 2:
        return (lambda p: p), {}, "as stored"
    from needle.model.quantize import WEIGHT_BITS, configure_deploy, cq_ste_params
    configure_deploy(act_bits=getattr(config, "act_bits", 8), kv_bits=getattr(config, "kv_bits", 8))
    return (lambda p: cq_ste_params(p, WEIGHT_BITS)), {"quant": True}, f"QAT (CQ W{WEIGHT_BITS} STE + A8)"


def score(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from needle.model import finetune
    from needle.model.architecture import SimpleAttentionNetwork
    from needle.model.run import load_checkpoint

    tok = use_tokenizer(args.tokenizer)
    params, config = load_checkpoint(args.checkpoint)
    config.dtype = "float32"   # as finetune_local
    params = jax.device_put(jax.tree.map(lambda a: np.asarray(a).astype(np.float32), params))
    model = SimpleAttentionNetwork(config)
    weights, apply_args, numerics = training_numerics(config)
    max_len = finetune.fit_max_len(args.data, tok, args.max_len)
    seqs, masks = finetune.load_jsonl(args.data, tok, max_len)
    n = len(seqs)
    # Pad the last batch with all-pad, zero-mask rows so one compiled shape serves every batch.
    b = max(1, min(args.batch, n))
    pad_rows = (-n) % b
    if pad_rows:
        seqs = np.concatenate([seqs, np.zeros((pad_rows, max_len), seqs.dtype)])
        masks = np.concatenate([masks, np.zeros((pad_rows, max_len), masks.dtype)])

    def sums(p, ids, mask):
        # finetune_local's loss_fn, returning numerator and denominator instead of their ratio
        logits = model.apply({"params": weights(p)}, ids, **apply_args)
        logits, targets, mask = logits[:, :-1], ids[:, 1:], mask[:, 1:]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return (ce * mask).sum(), mask.sum()

    sums_jit = jax.jit(sums)
    merge = jax.jit(finetune.merge_lora, static_argnums=2)

    def dataset_loss(p):
        num = den = 0.0
        for i in range(0, len(seqs), b):
            s, m = sums_jit(p, jnp.asarray(seqs[i:i + b]), jnp.asarray(masks[i:i + b]))
            num += float(s)
            den += float(m)
        return num / max(den, 1.0), den

    results = {"data": args.data, "examples": n, "seq_len": int(max_len), "numerics": numerics}
    started = time.time()
    base, tokens = dataset_loss(params)
    results["answer_tokens"] = int(tokens)
    results["base"] = base
    results["adapters"] = {}
    for path in args.adapters:
        lora, scale, rank = load_adapter(path)
        merged = merge(params, lora, scale)
        loss, _ = dataset_loss(merged)
        results["adapters"][path] = {"loss": loss, "rank": rank, "scale": scale, "groups": len(lora)}
    results["seconds"] = round(time.time() - started, 2)
    print("[score] " + json.dumps(results), flush=True)
    write_report(args.report, results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="run the reference's finetune_local, timed")
    t.add_argument("data")
    t.add_argument("--checkpoint", required=True)
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--lora-rank", type=int, default=16)
    t.add_argument("--lora-alpha", type=float, default=32.0)
    t.add_argument("--max-len", type=int, default=1024)
    t.add_argument("--val-split", type=float, default=0.1)
    t.add_argument("--seed", type=int, default=0, help="NumPy global seed (per-epoch shuffles)")
    t.add_argument("--out", required=True, help="adapter .pkl")
    t.add_argument("--report", default=None, help="also write the timing report as JSON here")
    b = sub.add_parser("build", help="build_main: merge the adapter, export a .cact")
    b.add_argument("checkpoint")
    b.add_argument("--lora", default=None)
    b.add_argument("--tokenizer", required=True)
    b.add_argument("--bits", type=int, default=4, choices=[2, 4])
    b.add_argument("--out", required=True)
    s = sub.add_parser("score", help="reference masked answer loss of base (+ adapters) over a dataset")
    s.add_argument("data")
    s.add_argument("adapters", nargs="*")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--tokenizer", required=True)
    s.add_argument("--max-len", type=int, default=1024)
    s.add_argument("--batch", type=int, default=8)
    s.add_argument("--report", default=None, help="also write the scores as JSON here")
    args = ap.parse_args()
    {"train": train, "build": build, "score": score}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
