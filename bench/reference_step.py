"""Time the reference's LoRA training step (cactus-needle 2.0.8, JAX on CPU) on a random-init model;
with `--preset needle3`, cactus-needle 3.2.8's (which must then be the `needle` on the path).

The step is the one `needle.model.finetune.finetune_local` jits: LoRA on the q/k/v/gate/out
kernels of the layer stack (`lora_target_paths`, `init_lora`, `merge_lora`), masked next-token
cross-entropy, `optax.chain(clip_by_global_norm(1.0), adamw(warmup_cosine_decay_schedule))`,
config.dtype = "float32" and the params cast to float32; Needle 3's step goes through its quantizers
(`cq_ste_params(merge_lora(...))`, `quant=True` after `configure_deploy`). Only the weights differ: a random init
(as tests/fixtures/make_fixtures.py `init_params` does it) instead of a checkpoint, and random
tokens instead of a data set, so nothing is read from disk.

    python3 bench/reference_step.py --preset tiny --steps 3
    python3 bench/reference_step.py --preset needle --batch 4 --seq 128 --steps 5 --json
    PYTHONPATH=<site-packages of cactus-needle 3.2.8> python3 bench/reference_step.py --preset needle3

Figures: first_step_s from process start (imports, init, compile included) to the end of step 1;
step_s the median of steps 2..N; tokens_per_s = batch*seq/step_s; peak_rss_mb from getrusage.
`bench/side_by_side.sh` runs this next to `needle bench`.
"""
import time

t0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

os.environ["JAX_PLATFORMS"] = "cpu"

# Same shapes as `needle bench --preset` (crates/engine/src/train/bench.rs); every other field
# keeps TransformerConfig's default (vocab 8192, engram_slots 8192, max_seq_len 2048, ...).
TINY = dict(d_model=128, num_heads=4, num_kv_heads=2, num_layers=2, mhc_lanes=2,
            engram_layers=(1,))
LR = 1e-4          # the peak the Rust bench's schedule uses
DATA_SEED = 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=("needle", "needle3", "tiny"), default="needle")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args()
    if args.batch < 1 or args.seq < 2 or args.steps < 1 or args.rank < 1:
        p.error("use --batch, --steps, --rank >= 1 and --seq >= 2")
    return args


def log(msg):
    print(f"  {msg}", file=sys.stderr, flush=True)


def main():
    args = parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from needle.model import architecture
    from needle.model.architecture import SimpleAttentionNetwork, TransformerConfig
    from needle.model.finetune import init_lora, lora_target_paths, merge_lora

    needle3 = args.preset == "needle3"
    if needle3 != (not hasattr(architecture, "PRESETS")):
        sys.exit(f"--preset {args.preset} needs cactus-needle {'3.2.8' if needle3 else '2.0.8'} as `needle`")
    if needle3:
        from needle.model.quantize import WEIGHT_BITS, configure_deploy, cq_ste_params
        shape = {}                                 # 3.x's TransformerConfig defaults are the release
    else:
        shape = dict(architecture.PRESETS["needle"]) if args.preset == "needle" else dict(TINY)
    config = TransformerConfig(**shape)
    config.dtype = "float32"                       # as finetune_local does
    t_import = time.time()

    # Random init, as make_fixtures.init_params: every parameter (2.x's probe heads too) is created.
    def init_everything(module, tokens):
        module(tokens)
        if not needle3:
            module.forward_contrastive(tokens, tokens)
            module.forward_confidence(tokens)

    model = SimpleAttentionNetwork(config)
    init = jax.jit(lambda key: model.init(key, jnp.ones((1, 16), jnp.int32),
                                          method=init_everything))
    params = dict(init(jax.random.PRNGKey(0))["params"])
    params = jax.tree.map(lambda a: np.asarray(a).astype(np.float32), params)
    params = jax.device_put(params)
    jax.block_until_ready(params)
    n_params = sum(int(a.size) for a in jax.tree.leaves(params))
    t_init = time.time()

    # --- from here on, finetune_local's step ---
    paths = lora_target_paths(params)
    rank, alpha = args.rank, 2.0 * args.rank
    scale = alpha / rank
    lora = init_lora(params, paths, rank, jax.random.PRNGKey(0))

    total_steps = args.steps + 1
    warmup = min(max(1, total_steps // 20), total_steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=LR, warmup_steps=warmup, decay_steps=total_steps)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
    opt_state = optimizer.init(lora)

    if needle3:
        configure_deploy(act_bits=config.act_bits, kv_bits=config.kv_bits)

    def loss_fn(lora, ids, mask):
        if needle3:
            merged = cq_ste_params(merge_lora(params, lora, scale), WEIGHT_BITS)
            logits = model.apply({"params": merged}, ids, quant=True)
        else:
            logits = model.apply({"params": merge_lora(params, lora, scale)}, ids)
        logits, targets, mask = logits[:, :-1], ids[:, 1:], mask[:, 1:]
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        return (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    @jax.jit
    def train_step(lora, opt_state, ids, mask):
        loss, grads = jax.value_and_grad(loss_fn)(lora, ids, mask)
        updates, opt_state = optimizer.update(grads, opt_state, lora)
        return optax.apply_updates(lora, updates), opt_state, loss

    rng = np.random.default_rng(DATA_SEED)
    ids = rng.integers(0, config.vocab_size, size=(args.batch, args.seq), dtype=np.int32)
    mask = np.zeros((args.batch, args.seq), np.float32)
    mask[:, args.seq // 2:] = 1.0                  # second half of each row is the answer
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)

    times, losses = [], []
    first_step_s = None
    for step in range(args.steps):
        start = time.time()
        lora, opt_state, loss = train_step(lora, opt_state, ids, mask)
        loss.block_until_ready()
        end = time.time()
        losses.append(float(loss))
        if step == 0:
            first_step_s = end - t0
            compile_s = end - start
        else:
            times.append(end - start)

    step_s = statistics.median(times) if times else compile_s
    report = {
        "impl": "reference",
        "preset": args.preset,
        "batch": args.batch,
        "seq": args.seq,
        "first_step_s": round(first_step_s, 4),
        "step_s": round(step_s, 4),
        "tokens_per_s": round(args.batch * args.seq / step_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    log(f"{'breakdown':<11} imports {t_import - t0:.2f} s, init {t_init - t_import:.2f} s, "
        f"step 1 (compile + run) {compile_s:.2f} s; {n_params / 1e6:.1f} M params, "
        f"{len(paths)} LoRA groups, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        print(f"  {'reference':<11} jax {jax.__version__} on {jax.default_backend()}, float32")
        print(f"  {'shape':<11} {args.batch} x {args.seq} tokens, rank {rank}, {args.preset}")
        print(f"  {'first step':<11} {report['first_step_s']:.2f} s (from process start)")
        print(f"  {'step':<11} {report['step_s']:.3f} s (median)  "
              f"{report['tokens_per_s']:.0f} tokens/s")
        print(f"  {'peak RSS':<11} {report['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
