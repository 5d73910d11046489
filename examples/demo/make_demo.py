"""Make the app's first-run example: the smart-home dataset, and for either generation a small base meant
to write tool calls for tools it never saw, so that fine-tuning on the dataset visibly helps.

    python3 examples/demo/corpus.py                 # smart_home.jsonl alone, in a second
    python3 examples/demo/make_demo.py [--steps N]  # and the base of the generation installed (with jax flax
                                                    # optax sentencepiece, and safetensors for Needle 3):
        cactus-needle==2.0.8:  base.pkl and tokenizer.model next to this file
        cactus-needle==3.2.8:  needle3/base.safetensors and needle3/tokenizer.model
    (--generation N stops at once when the package installed is not Needle N's)

What the dataset and the pre-training corpus hold is said in corpus.py. The base, written with its
tokenizer to --out's folder:
    tokenizer.model   sentencepiece BPE over the pre-training corpus alone (pad 0, eos 1, bos 2, unk 3,
                      the generation's chat markers from 4 on: ten for Needle 2, sixteen for Needle 3;
                      byte fallback, every digit a piece of its own so that numbers copy from a query
                      into a call piece by piece). Trained on the app's rows too, it would make pieces of
                      the app's words that pre-training never trains.
    base.pkl          Needle 2: a format-v2 pickle stored as float16, pre-trained by 2.0.8's own network
    base.safetensors  Needle 3: a safetensors checkpoint as 3.2.8's write_checkpoint saves it, stored as
                      bfloat16 as the released one is, pre-trained by 3.2.8's own network with its
                      quantization-aware training on (the weights through CQ W4 straight-through, the
                      activations and KV fake-quantized, as its finetune trains), so that its W4 .cact
                      keeps what the model knows
both with full-parameter AdamW on the corpus's answers. Everything is seeded; JAX runs on CPU.
"""
import argparse
import dataclasses
import importlib.metadata
import os
import pickle
import random
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("NEEDLE_TELEMETRY", "0")

import jax
import jax.numpy as jnp
import numpy as np
import optax

from needle.model import finetune
from needle.model.architecture import SimpleAttentionNetwork, TransformerConfig
from needle.model.run import CHECKPOINT_FORMAT_VERSION
from needle.model.tokenizer import CHAT_MARKERS, SANTokenizer

from corpus import SEED, pretrain_example, write_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from fixture_common import config_dict, masked_train_step, train_bpe  # noqa: E402  (shared with the fixtures)

VOCAB = 2048


@dataclasses.dataclass(frozen=True)
class Generation:
    """What differs between the two generations' demo bases."""
    shape: dict
    checkpoint: str     # the default --out
    qat: bool           # pre-trained through the W4 weights and 8-bit activations it ships with


GENERATIONS = {
    2: Generation(
        shape=dict(vocab_size=VOCAB, d_model=256, num_heads=8, num_kv_heads=4, num_layers=4, max_seq_len=512,
                   contrastive_dim=32, mhc_lanes=2, engram_layers=(1,), engram_slots=512),
        checkpoint=os.path.join(HERE, "base.pkl"), qat=False),
    # Needle 3's parts at a small size: windowed layers (256) between global ones, Q/K/V conv taps, the
    # Monarch MLP, an engram site; no probe heads (a fine-tune leaves them untrained anyway).
    3: Generation(
        shape=dict(vocab_size=VOCAB, d_model=256, num_heads=8, num_kv_heads=4, num_layers=4, qk_head_dim=32,
                   v_head_dim=32, max_seq_len=512, engram_layers=(1,), engram_slots=512, global_layers=(1, 3),
                   sliding_window=256, mhc_lanes=2, qkv_conv_taps=3, remat=False),
        checkpoint=os.path.join(HERE, "needle3", "base.safetensors"), qat=True),
}


def log(msg):
    print(f"[make_demo] {msg}", flush=True)


def installed_generation():
    return int(importlib.metadata.version("cactus-needle").split(".")[0])


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


def train_step(model, optimizer, config, qat):
    """The jitted step; with `qat`, through the numerics 3.2.8's finetune trains with (and its export
    ships): the weights CQ W4 straight-through, activations and KV fake-quantized."""
    if not qat:
        return masked_train_step(model, optimizer)
    from needle.model.quantize import WEIGHT_BITS, configure_deploy, cq_ste_params

    configure_deploy(act_bits=config.act_bits, kv_bits=config.kv_bits)
    return masked_train_step(model, optimizer, weights=lambda p: cq_ste_params(p, WEIGHT_BITS), quant=True)


def pretrain(tok, rows, generation, args):
    config = TransformerConfig(**generation.shape, dtype="float32")
    model = SimpleAttentionNetwork(config)
    params = model.init(jax.random.PRNGKey(args.seed), jnp.ones((1, 16), jnp.int32))["params"]
    log(f"{sum(a.size for a in jax.tree.leaves(params)):,} parameters")
    by_bucket = {}
    for row in rows:
        by_bucket.setdefault(bucket(tok, row), []).append(row)
    groups = {b: encode_rows(tok, rs, b) for b, rs in by_bucket.items()}
    sizes = np.array([len(groups[b][0]) for b in sorted(groups)], np.float64)
    log("buckets " + ", ".join(f"{b}: {len(groups[b][0])}" for b in sorted(groups)))
    steps, lr = args.steps, args.lr
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 20), steps, lr / 20)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    opt_state = optimizer.init(params)
    step_fn = train_step(model, optimizer, config, generation.qat)
    save = save_safetensors if args.out.endswith(".safetensors") else save_pickle
    run = {"seed": args.seed, "examples": len(rows), "batch": args.batch, "lr": lr, "qat": generation.qat}

    rng = np.random.default_rng(args.seed)
    started, losses = time.time(), []
    for step in range(1, steps + 1):
        b = sorted(groups)[rng.choice(len(sizes), p=sizes / sizes.sum())]
        ids, mask = groups[b]
        pick = rng.choice(len(ids), min(args.batch, len(ids)), replace=False)
        params, opt_state, loss = step_fn(params, opt_state, jnp.asarray(ids[pick]), jnp.asarray(mask[pick]))
        losses.append(float(loss))
        if step % 50 == 0 or step == steps:
            log(f"step {step}/{steps} answer loss {np.mean(losses[-50:]):.4f} ({time.time() - started:.0f}s)")
        if step % args.save_every == 0 or step == steps:
            save(args.out, params, config, step, dict(run, seconds=round(time.time() - started)))
    log(f"pre-trained in {time.time() - started:.0f}s")
    return params


def stored_config(config):
    fields = config_dict(config)
    fields["dtype"] = "bfloat16"   # as released checkpoints say; every run computes in float32
    return fields


def save_pickle(path, params, config, step, run):
    """A format-v2 checkpoint, float16 like a released one would be stored compactly; written to a
    temporary file and renamed, so an interrupted run leaves the last good one."""
    params = jax.tree.map(lambda a: np.asarray(a, np.float16), params)
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"format_version": CHECKPOINT_FORMAT_VERSION, "params": params, "config": stored_config(config),
                     "step": step, "run": dict(run, name="needle-studio demo base")}, f)
    os.replace(path + ".tmp", path)


def save_safetensors(path, params, config, step, run):
    """A checkpoint as 3.2.8's write_checkpoint saves it, bfloat16 as the released one is stored; written
    to a temporary file and renamed, so an interrupted run leaves the last good one."""
    from needle.model.checkpoints import write_checkpoint

    params = jax.tree.map(lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16)), params)
    partial = path[: -len(".safetensors")] + ".partial.safetensors"
    write_checkpoint(partial, {"format_version": CHECKPOINT_FORMAT_VERSION, "params": params,
                               "config": stored_config(config), "step": step,
                               "run": dict(run, name="needle-studio demo base")})
    os.replace(partial, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generation", type=int, choices=sorted(GENERATIONS),
                        help="the generation to make (default: the installed cactus-needle's)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--out", help="the checkpoint to write (default: the generation's, see above)")
    args = parser.parse_args()

    home = write_dataset(args.seed)
    installed = installed_generation()
    if args.generation not in (None, installed):
        sys.exit(f"make_demo.py: --generation {args.generation} needs cactus-needle {args.generation}.x, "
                 f"but {importlib.metadata.version('cactus-needle')} is installed")
    generation = GENERATIONS[installed]
    args.out = args.out or generation.checkpoint
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rng = random.Random(args.seed)
    corpus = [pretrain_example(rng) for _ in range(args.examples)]
    tok = train_tokenizer(corpus, os.path.join(os.path.dirname(os.path.abspath(args.out)), "tokenizer.model"))
    lengths = [len(tok.encode("".join(finetune.render_example(r)))) for r in home]
    log(f"Needle {installed}; smart_home: {len(home)} rows, {min(lengths)}-{max(lengths)} tokens")
    pretrain(tok, corpus, generation, args)


if __name__ == "__main__":
    main()
