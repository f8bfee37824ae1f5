"""The trained models every benchmark reads: one `symmerge train` command per model, by name, into `runs/`.

A benchmark's inputs are named in its result file (`inputs`) and in its section of benchmarks/README.md;
`python benchmarks/pairs.py NAME ...` trains them, one model at a time, at the thread count given (the
recorded models were trained at 1 thread: training's last bits depend on the count). A model whose
folder already holds `model.safetensors` is skipped. What each model reached (final training loss,
validation and test loss and accuracy, from its `symmerge.json`) is recorded in `results/pairs.json`. Data lies
beside the checkout (`../shared/data`,
or `--data-root`).

    python benchmarks/pairs.py --list                       # every name, its models and commands
    python benchmarks/pairs.py vit-demo llama-char-demo     # both seeds of each
    python benchmarks/pairs.py vit-demo --seeds 0,1,2,3     # the many-model benchmark's four ViTs
    python benchmarks/pairs.py --set many-width --jobs 2    # default_many.py's models, two trained at once
    python benchmarks/pairs.py --set unseen --jobs 2        # pairs on data no default was tuned on

Each name is a family of models that differ only in the seed (`{seed}` in the folder and command).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import record

TS = "{data}/tinyshakespeare.txt"
MNIST = "{data}/mnist/mnist.pkl.gz"
WIKI = "{data}/wikitext2-test.txt"
FASHION = "{data}/fashion-mnist"
DEMO_LM = "--preset demo --tokenizer char --data " + TS + " --steps 1500 --warmup 75"
DEMO_VIT = "--arch vit --preset demo --data " + MNIST + " --steps 1500 --warmup 75"
#: the demo recipes on data no recipe or default was tuned on: WikiText-2's test file, Fashion-MNIST
UNSEEN_LM = "--preset demo --tokenizer char --data " + WIKI + " --steps 1500 --warmup 75"
UNSEEN_VIT = "--arch vit --preset demo --data " + FASHION + " --steps 1500 --warmup 75"

#: name -> (folder under runs/ with {seed}, `symmerge train` arguments with {seed} and {data}, default seeds)
PAIRS: dict[str, tuple[str, str, tuple[int, ...]]] = {
    "gpt2-char-tiny": ("ts-char-tiny-seed{seed}", "--arch gpt2 --preset tiny --data " + TS
                       + " --seed {seed} --steps 1500 --batch-size 32 --lr 3e-3 --warmup 50", (0, 1)),
    "gpt2-char-small": ("ts-char-small-seed{seed}", "--arch gpt2 --preset small --tokenizer char --data " + TS
                        + " --seed {seed} --steps 350 --warmup 35 --batch-size 8 --save-every 50", (0, 1)),
    "gpt2-bpe-small-140": ("ts-gpt2bpe-small-seed{seed}", "--arch gpt2 --preset small --tokenizer gpt2 --gpt2-bpe "
                           "{data} --data " + TS + " --seed {seed} --steps 140 --warmup 14 --batch-size 4 "
                           "--save-every 20", (0, 1)),
    "gpt2-bpe-small-240": ("ts-gpt2bpe-small-240-seed{seed}", "--arch gpt2 --preset small --tokenizer gpt2 --gpt2-bpe "
                           "{data} --data " + TS + " --seed {seed} --steps 240 --warmup 24 --batch-size 4 "
                           "--save-every 25", (0, 1)),
    "vit-demo": ("mnist-vit-demo-seed{seed}", DEMO_VIT + " --seed {seed}", (0, 1)),
    "vit-demo-6k": ("mnist-vit-demo6k-seed{seed}", "--arch vit --preset demo --data " + MNIST
                    + " --seed {seed} --steps 6000 --warmup 300", (0, 1)),
    "vit-demo-w256": ("mnist-vit-w256lr-seed{seed}", DEMO_VIT + " --d-model 256 --d-mlp 1024 --lr 1e-3 --seed {seed}",
                      (0, 1)),
    "vit-wide": ("mnist-vit-wide-seed{seed}", DEMO_VIT + " --d-model 256 --d-mlp 512 --seed {seed}", (1,)),
    "gpt2-char-demo": ("ts-char-gpt2-demo-seed{seed}", "--arch gpt2 " + DEMO_LM + " --seed {seed}", (0, 1)),
    "gpt2-char-wide": ("ts-char-gpt2-wide-seed{seed}", "--arch gpt2 " + DEMO_LM + " --d-model 256 --d-mlp 1024 "
                       "--seed {seed}", (1,)),
    "llama-char-demo": ("ts-char-llama-demo-seed{seed}", "--arch llama " + DEMO_LM + " --seed {seed}", (0, 1)),
    "llama-char-wide": ("ts-char-llama-wide-seed{seed}", "--arch llama " + DEMO_LM + " --d-model 256 --d-mlp 688 "
                        "--seed {seed}", (1,)),
    "llama-mha-char-demo": ("ts-char-llama-mha-demo-seed{seed}", "--arch llama " + DEMO_LM + " --kv-heads 4 "
                            "--seed {seed}", (0, 1)),
    "qwen3-char-demo": ("ts-char-qwen3-demo-seed{seed}", "--arch qwen3 " + DEMO_LM + " --seed {seed}", (0, 1)),
    "qwen3moe-char-demo": ("ts-char-qwen3moe-demo-seed{seed}", "--arch qwen3_moe " + DEMO_LM + " --seed {seed}", (0, 1)),
    "qwen2moe-char-demo": ("ts-char-qwen2moe-demo-seed{seed}", "--arch qwen2_moe " + DEMO_LM + " --seed {seed}",
                           (0, 1)),
    "gemma3-char-demo": ("ts-char-gemma3-demo-seed{seed}", "--arch gemma3 " + DEMO_LM + " --seed {seed}", (0, 1)),
    "phi3-char-demo": ("ts-char-phi3-demo-seed{seed}", "--arch phi3 " + DEMO_LM + " --seed {seed}", (0, 1)),
    "olmo-char-demo": ("ts-char-olmo-demo-seed{seed}", "--arch olmo " + DEMO_LM + " --seed {seed}", (0, 1)),
    "olmo2-char-demo": ("ts-char-olmo2-demo-seed{seed}", "--arch olmo2 " + DEMO_LM + " --seed {seed}", (0, 1)),
    "neox-char-demo": ("ts-char-neox-demo-seed{seed}", "--arch neox " + DEMO_LM + " --seed {seed}", (0, 1)),
    "neox-rot100-char-demo": ("ts-char-neox-rot100-demo-seed{seed}", "--arch neox " + DEMO_LM + " --rotary-pct 1.0 "
                              "--seed {seed}", (0, 1)),
    "neox-rot06-char-demo": ("ts-char-neox-rot06-demo-seed{seed}", "--arch neox " + DEMO_LM + " --rotary-pct 0.0625 "
                             "--seed {seed}", (0, 1)),
    "neox-rot50-char-demo": ("ts-char-neox-rot50-demo-seed{seed}", "--arch neox " + DEMO_LM + " --rotary-pct 0.5 "
                             "--seed {seed}", (0, 1)),
    "neox-seq-char-demo": ("ts-char-neox-seq-demo-seed{seed}", "--arch neox " + DEMO_LM + " --parallel-residual off "
                           "--seed {seed}", (0, 1)),
    "gpt2-wiki-char-demo": ("wiki-char-gpt2-demo-seed{seed}", "--arch gpt2 " + UNSEEN_LM + " --seed {seed}", (0, 1)),
    "llama-wiki-char-demo": ("wiki-char-llama-demo-seed{seed}", "--arch llama " + UNSEEN_LM + " --seed {seed}", (0, 1)),
    "neox-wiki-char-demo": ("wiki-char-neox-demo-seed{seed}", "--arch neox " + UNSEEN_LM + " --seed {seed}", (0, 1)),
    "vit-fashion-demo": ("fashion-vit-demo-seed{seed}", UNSEEN_VIT + " --seed {seed}", (0, 1)),
}


#: a named set of models -> (pairs.py name, seeds or None for the name's own) for each member
SETS: dict[str, list[tuple[str, tuple[int, ...] | None]]] = {
    "many-width": [(four, (0, 1, 2, 3)) for four in ("vit-demo", "gpt2-char-demo", "llama-char-demo")]
    + [(wide, None) for wide in ("vit-wide", "gpt2-char-wide", "llama-char-wide")],
    "unseen": [(name, None) for name in ("vit-fashion-demo", "gpt2-wiki-char-demo", "llama-wiki-char-demo",
                                         "neox-wiki-char-demo")],
}
SET_TITLES = {"many-width": "the many-model and width set (benchmarks/default_many.py): four models each of vit-demo, "
                            "gpt2-char-demo and llama-char-demo (seeds 0-3), and the wide model of each (seed 1)",
              "unseen": "pairs on data no default was tuned on (benchmarks/default_dual.py): the demo recipes of ViT "
                        "on Fashion-MNIST and of GPT-2, Llama and GPT-NeoX on WikiText-2's test file (characters)"}


def commands(name: str, seeds: tuple[int, ...] | None = None, runs: str = "runs", data: str = "../shared/data",
             threads: int = 1) -> list[tuple[str, list[str]]]:
    """(folder, `symmerge train` argv) for every seed of `name`."""
    folder, args, default = PAIRS[name]
    out = []
    for seed in default if seeds is None else seeds:
        argv = ["train", *shlex.split(args.format(seed=seed, data=data)), "--threads", str(threads)]
        out.append((f"{runs}/{folder.format(seed=seed)}", argv + ["-o", f"{runs}/{folder.format(seed=seed)}"]))
    return out


def data_of(name: str, data: str = "../shared/data") -> str:
    """The `--data` a model of `name` is trained on: the data every benchmark of the pair reads."""
    argv = shlex.split(PAIRS[name][1].format(seed=0, data=data))
    return argv[argv.index("--data") + 1]


def data_files(data: str = "../shared/data") -> list[str]:
    """Every `--data` some pair trains on, relative to `data`, sorted (GPT-2's BPE files, which `--gpt2-bpe` finds
    in `data` itself, aside)."""
    return sorted({data_of(name, data)[len(data) + 1:] for name in PAIRS})


def is_vision(name: str) -> bool:
    """Whether `name` is an image classifier (its barriers are per image, its test split the image test set)."""
    return "--arch vit" in PAIRS[name][1]


def describe(name: str) -> str:
    """The commands of `name` as one shell line per model (the README's form)."""
    return "\n".join("symmerge " + shlex.join(argv) for _, argv in commands(name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models to train: {', '.join(PAIRS)}")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the name's own)")
    ap.add_argument("--set", choices=list(SETS), default=None, help="train a named set of models (with the names given)")
    ap.add_argument("--runs", default="runs", help="folder the models are written under")
    ap.add_argument("--data-root", default="../shared/data", help="folder holding the data (tinyshakespeare.txt, mnist/, ...)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="models trained at once (each at --threads)")
    ap.add_argument("--list", action="store_true", help="print every name and its commands")
    record.add_argument(ap, "pairs")
    args = ap.parse_args(argv)
    if args.list or not (args.names or args.set):
        for name in PAIRS:
            print(f"{name}:\n{describe(name)}\n")
        return 0
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None
    wanted = [(name, seeds) for name in args.names] + SETS.get(args.set, [])
    for name, _ in wanted:
        if name not in PAIRS:
            raise SystemExit(f"unknown name {name!r}: choose from {', '.join(PAIRS)}")
    todo = []
    for name, s in wanted:
        for folder, train in commands(name, s, args.runs, args.data_root, args.threads):
            if (Path(folder) / "model.safetensors").is_file():
                print(f"skip {folder} (trained)")
            else:
                todo.append((folder, train))

    def run(job: tuple[str, list[str]]) -> None:
        folder, train = job
        with training_lock(Path(folder)):
            if (Path(folder) / "model.safetensors").is_file():
                print(f"skip {folder} (trained meanwhile by another pairs.py)", flush=True)
                return
            print("symmerge " + shlex.join(train), flush=True)
            subprocess.run([sys.executable, "-m", "symmerge", *train], check=True, stdout=subprocess.DEVNULL)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(run, todo))
    print(f"trained {len(todo)} models in {time.perf_counter() - t0:.0f} s ({args.jobs} at once, "
          f"{args.threads} thread each)", flush=True)
    groups = [(name, name, [(name, s)]) for name, s in wanted[:len(args.names)]]
    if args.set:
        groups.append((args.set, SET_TITLES[args.set], SETS[args.set]))
    for key, title, members in groups:
        rows = [trained(folder) for name, s in members
                for folder, _ in commands(name, s, args.runs, args.data_root, args.threads)]
        total = sum(float(r[2]) for r in rows)
        record.save(args.results, "pairs", key, title, [record.table(key, COLUMNS, rows)],
                    notes=f"training time summed over the models: {total:.0f} s ({total / 60:.1f} min at one thread; "
                          f"{total / 120:.1f} min two at a time at one thread each, when they take as long); times as "
                          "measured, on a machine shared with other jobs")
    return 0


COLUMNS = ["model", "steps", "training s", "train", "validation", "test", "test accuracy"]


@contextlib.contextmanager
def training_lock(folder: Path):
    """Held while `folder` is trained: another process (two queues of benchmarks naming one model) waits here until
    the first is done, then finds the model trained. The lock file (`.FOLDER.lock` beside it) is left in place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def trained(folder: str) -> list[str]:
    """A trained model's row: its final figures as `symmerge train` recorded them."""
    t = json.loads((Path(folder) / "symmerge.json").read_text())["train"]
    v, s = t["validation"], t["test"]
    return [Path(folder).name, str(t["steps_done"]), f"{t['wall_s']:.0f}", f"{t['final_train_loss']:.3f}",
            f"{v['loss']:.3f} ± {v['loss_se']:.3f}", f"{s['loss']:.3f} ± {s['loss_se']:.3f}", f"{s['accuracy']:.4f}"]


if __name__ == "__main__":
    sys.exit(main())
