"""The reference side of bench/calls_side_by_side.sh (cactus-needle 2.0.8, JAX on CPU).

    # LoRA fine-tune with the reference's finetune_local (what its `needle finetune` runs)
    python3 bench/calls/reference_finetune.py train DATA --checkpoint CKPT --tokenizer TOK \\
        --epochs 8 --batch-size 8 --lr 3e-3 --lora-rank 8 --lora-alpha 16 --max-len 512 --out ADAPTER.pkl

    # merge the adapter and export a .cact with the reference's build_main (its `needle build`)
    python3 bench/calls/reference_finetune.py build CKPT --lora ADAPTER.pkl --tokenizer TOK \\
        --bits 4 --out TUNED.cact

Both call the reference's functions with the argparse.Namespace its CLI builds. The one patch is
the tokenizer: the reference loads needle/model/tokenizer.model from its package directory (or
downloads Needle 2's from the hub) via get_tokenizer(); it is rebound to load --tokenizer
instead, as bench/finetune/reference_finetune.py does (its use_tokenizer is reused here). The
NumPy global seed is set to --seed so the per-epoch shuffles (np.random.permutation) repeat;
the LoRA init is seeded inside finetune_local (PRNGKey(0)). `train` ends with one line
`[reference] {"finetune_s": ...}`: the seconds finetune_local took (imports excluded).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def use_tokenizer(path):
    """bench/finetune/reference_finetune.py's use_tokenizer (loaded by path: same module name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "finetune_bench_reference", os.path.join(os.path.dirname(__file__), "..", "finetune", "reference_finetune.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.use_tokenizer(path)


def train(args):
    import numpy as np
    from needle.model import finetune
    use_tokenizer(args.tokenizer)
    np.random.seed(args.seed)
    # exactly the attributes finetune_local reads (cli.py's `needle finetune` namespace)
    ns = argparse.Namespace(
        jsonl_path=args.data, checkpoint=args.checkpoint, epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, max_len=args.max_len,
        val_split=0.0, generate=0, model=None, workers=1,
        checkpoint_dir=os.path.dirname(os.path.abspath(args.out)), out=args.out)
    started = time.time()
    finetune.finetune_local(ns)
    print("[reference] " + json.dumps({"finetune_s": round(time.time() - started, 2)}), flush=True)


def build(args):
    from needle.model import finetune
    use_tokenizer(args.tokenizer)
    # build_main reads checkpoint, lora, bits (a string, as argparse gives it), out, upload
    finetune.build_main(argparse.Namespace(checkpoint=args.checkpoint, lora=args.lora,
                                           bits=str(args.bits), out=args.out, upload=False))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="finetune_local")
    t.add_argument("data")
    t.add_argument("--checkpoint", required=True)
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--epochs", type=int, default=8)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--lora-rank", type=int, default=8)
    t.add_argument("--lora-alpha", type=float, default=16.0)
    t.add_argument("--max-len", type=int, default=512)
    t.add_argument("--seed", type=int, default=0, help="NumPy global seed (per-epoch shuffles)")
    t.add_argument("--out", required=True, help="adapter .pkl")
    b = sub.add_parser("build", help="build_main: merge the adapter, export a .cact")
    b.add_argument("checkpoint")
    b.add_argument("--lora", default=None)
    b.add_argument("--tokenizer", required=True)
    b.add_argument("--bits", type=int, default=4, choices=[2, 4])
    b.add_argument("--out", required=True)
    args = ap.parse_args()
    (train if args.mode == "train" else build)(args)


if __name__ == "__main__":
    sys.exit(main())
