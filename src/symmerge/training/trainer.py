"""Train a small stock HF model from scratch: AdamW, linear warmup + cosine decay, gradient clipping.

Determinism: the seed fixes the initialisation (`torch.manual_seed(seed)` before the HF constructor)
and the data order (epoch e visits the training items in `randperm(n)` drawn from a generator seeded by
`(seed, e)`; step k reads batch k mod n//B of epoch k div n//B, so the loader position is the step).
Deterministic algorithms are switched on while training; with the same torch build, device and thread
count the same seed gives bitwise the same weights.

Device and precision (`devices`): the model trains on `device`; with `dtype` bfloat16 or float16 the
forward and backward run under autocast while the master weights, AdamW's state and the written
checkpoint stay float32 (float16 also scales the loss, `torch.amp.GradScaler`, whose state is saved).
The dtype is part of the run's settings (a resumed run must use the same); the device is not.

Resuming: `OUT/.train_state/` holds the model skeleton (config + tokenizer or preprocessor config),
`params.safetensors` (parameters), `optim.safetensors` (AdamW moments and step counts), `rng.safetensors`
(torch's CPU RNG state; the presets have no dropout, so no device RNG is drawn from) and `state.json` (step,
loader position, LR-schedule position, run settings, per-step losses, the loss scaler's state). It is
written atomically every `save_every` steps; a resumed run repeats exactly the computation an
uninterrupted one would have done (tested bitwise). No pickles anywhere.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..data.batches import load_items, read_text
from ..data.images import is_image_source, load_images, processor_config, write_processor_config
from ..data.tokenizers import build_tokenizer
from ..errors import SymmergeError
from ..evaluation.forward import model_inputs
from ..runtime.devices import DTYPES, autocast
from ..store.io import AtomicFolder, clean_stale, prepare_output
from ..store.optim_state import optimizer_tensors, restore_optimizer
from ..store.provenance import write_metadata
from .presets import HF_CLASSES, Preset, get_preset, lm_config, reshaped, vit_config

STATE = ".train_state"
SKELETON = "skeleton"
SIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "preprocessor_config.json")


@dataclass
class TrainArgs:
    arch: str
    preset: str
    data: str
    seed: int
    out: str
    tokenizer: str = "char"
    gpt2_bpe: str | None = None
    vocab_size: int = 2048
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup: int | None = None
    save_every: int | None = None
    resume: bool = False
    force: bool = False
    progress: bool = True
    stop_after: int | None = None  # save the state and stop after this many steps (simulates an interruption)
    shape: dict | None = None  # overrides of the preset's shape (presets.SHAPE_FIELDS), e.g. {"d_model": 256}
    device: str = "cpu"  # where training runs (checked by devices.resolve_device in the command)
    dtype: str = "float32"  # of the forward and backward under autocast (devices.DTYPES); weights stay float32

    def __post_init__(self):
        self.shape = {k: v for k, v in (self.shape or {}).items() if v is not None} or None  # flags not given
        if self.dtype not in DTYPES:
            raise SymmergeError(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")

    def run_key(self, p: Preset) -> dict:
        """The settings a resumed run must share with the interrupted one (the shape only when overridden,
        so runs saved before shape overrides existed still resume)."""
        return ({"shape": self.shape} if self.shape else {}) | ({"dtype": self.dtype} if self.dtype != "float32" else {}) | {
                "arch": self.arch, "preset": self.preset, "data": str(self.data), "seed": self.seed,
                "tokenizer": self.tokenizer if self.arch != "vit" else None, "vocab_size": self.vocab_size,
                "steps": self.steps or p.steps, "batch_size": self.batch_size or p.batch_size, "lr": self.lr or p.lr,
                "warmup": p.warmup if self.warmup is None else self.warmup}


def lr_at(step: int, steps: int, p: Preset, lr: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine from lr to lr * min_lr_ratio at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """Item indices of training batch `step`: consecutive chunks of a per-epoch permutation."""
    per_epoch = n // batch_size
    epoch, j = divmod(step, per_epoch)
    gen_seed = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(gen_seed))
    return perm[j * batch_size:(j + 1) * batch_size]


def _make_skeleton(args: TrainArgs, p: Preset, folder: Path):
    """config.json + tokenizer (LM) or preprocessor_config.json (ViT) in `folder`; returns the config."""
    folder.mkdir(parents=True, exist_ok=True)
    if args.arch == "vit":
        if not is_image_source(args.data):
            raise SymmergeError(f"--arch vit needs image data (a folder of IDX files, mnist.pkl.gz or digits), not {args.data}")
        x, y = load_images(args.data, "train")
        scaled = x / 255.0
        config = vit_config(p, int(x.shape[-1]), int(y.max()) + 1)
        cfg = processor_config(int(x.shape[-1]), 1, round(float(scaled.mean()), 4), round(float(scaled.std()), 4))
        write_processor_config(folder, cfg)
    else:
        if is_image_source(args.data):
            raise SymmergeError(f"--arch {args.arch} is a language model; pass a text file, not {args.data}")
        tok = build_tokenizer(args.tokenizer, read_text(args.data), args.gpt2_bpe, args.vocab_size)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
        config = lm_config(args.arch, p, len(tok), eos, eos)
        tok.save_pretrained(str(folder))
    config.architectures = [HF_CLASSES[args.arch]]
    config.save_pretrained(str(folder))
    return config


def _new_model(args: TrainArgs, skeleton: Path):
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(skeleton), local_files_only=True)
    torch.manual_seed(args.seed)
    return getattr(transformers, HF_CLASSES[args.arch])(config).to(torch.float32).to(torch.device(args.device))


def _optimizer(model, p: Preset, lr: float):
    decay = [q for q in model.parameters() if q.ndim >= 2]
    no_decay = [q for q in model.parameters() if q.ndim < 2]
    groups = [{"params": decay, "weight_decay": p.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=p.betas, foreach=False)


def _indices(opt) -> list[str]:
    """The optimiser's parameters named by their place over all groups (`optim.safetensors`' keys `I.entry`)."""
    return [str(i) for i in range(sum(len(g["params"]) for g in opt.param_groups))]


def save_state(model, opt, step: int, info: dict, state_dir: Path, skeleton: Path) -> None:
    """Write the resumable state atomically (parameters, optimiser, RNG, JSON)."""
    with AtomicFolder(state_dir) as tmp:
        shutil.copytree(skeleton, tmp / SKELETON)
        save_file({k: v.detach().cpu().contiguous() for k, v in model.named_parameters()}, str(tmp / "params.safetensors"))
        tensors = optimizer_tensors(opt, _indices(opt))
        save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, str(tmp / "optim.safetensors"))
        save_file({"cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        groups = opt.state_dict()["param_groups"]
        (tmp / "state.json").write_text(json.dumps(info | {"step": step, "param_groups": groups}, indent=1))


def load_state(model, opt, state_dir: Path) -> dict:
    info = json.loads((state_dir / "state.json").read_text())
    params = load_file(str(state_dir / "params.safetensors"))
    with torch.no_grad():
        for k, v in model.named_parameters():
            v.copy_(params[k])
    restore_optimizer(opt, _indices(opt), load_file(str(state_dir / "optim.safetensors")))
    for group, saved in zip(opt.param_groups, info["param_groups"], strict=True):
        group.update({k: v for k, v in saved.items() if k != "params"})
    torch.set_rng_state(load_file(str(state_dir / "rng.safetensors"))["cpu"])
    return info


def _prepare(args: TrainArgs, p: Preset, out: Path) -> tuple[Path, dict | None]:
    """Check OUT and the resume state; returns (skeleton folder, recorded state.json or None)."""
    state_dir = out / STATE
    if args.resume:
        if not (state_dir / "state.json").is_file():
            raise SymmergeError(f"{out} has no {STATE}/state.json to resume from; start without --resume")
        info = json.loads((state_dir / "state.json").read_text())
        if info["run"] != args.run_key(p):
            diff = {k: (info["run"].get(k), v) for k, v in args.run_key(p).items() if info["run"].get(k) != v}
            raise SymmergeError(f"--resume with different settings than the saved run (saved, given): {diff}")
        return state_dir / SKELETON, info
    clean_stale(state_dir)  # a state write a SIGKILL cut: its temporary folder is no output
    prepare_output(out, args.force)
    if state_dir.exists():  # --force: a previous run's state must not be mixed with this one
        shutil.rmtree(state_dir)
    return Path(tempfile.mkdtemp(prefix=".symmerge-skeleton-", dir=out.parent if out.parent.exists() else None)), None


def _start(args: TrainArgs, p: Preset, skeleton: Path, state_dir: Path):
    """A fresh run: skeleton (in a temporary folder), initial model, training items, state at step 0."""
    try:
        _make_skeleton(args, p, skeleton)
        model = _new_model(args, skeleton)
        opt = _optimizer(model, p, args.lr or p.lr)
        items = load_items(skeleton, args.data, "train", p.context or None)
        info = {"run": args.run_key(p), "losses": [], "position": {"epoch": 0, "batch": 0}, "wall_s": 0.0,
                "threads": torch.get_num_threads(), "n_train": len(items["labels"])}
        save_state(model, opt, 0, info, state_dir, skeleton)
    finally:
        shutil.rmtree(skeleton, ignore_errors=True)
    info["step"] = 0
    return model, opt, items, info


def _scaler(args: TrainArgs, info: dict):
    """float16's loss scaler, from the saved state when there is one; None for the other dtypes."""
    if args.dtype != "float16":
        return None
    scaler = torch.amp.GradScaler(torch.device(args.device).type)
    if info.get("scaler"):
        scaler.load_state_dict(info["scaler"])
    return scaler


def _step(model, opt, batch: dict, lr: float, clip: float, dtype: torch.dtype, scaler=None) -> float:
    """One AdamW step: the forward under autocast to `dtype` (float32 master weights), gradients clipped
    (unscaled first when float16 scales the loss)."""
    for g in opt.param_groups:
        g["lr"] = lr
    params = next(model.parameters())
    with autocast(params.device, dtype):
        loss = model(**model_inputs(batch, torch.float32, params.device, labels=True)).loss
    if scaler is None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False)
        scaler.step(opt)
        scaler.update()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _loop(args: TrainArgs, p, model, opt, items, state_dir, skeleton, info) -> dict:
    from ..runtime.progress import tqdm

    steps, bs, lr0 = info["run"]["steps"], info["run"]["batch_size"], info["run"]["lr"]
    n = len(items["labels"])
    if n < bs:
        raise SymmergeError(f"the training split has {n} items, fewer than one batch of {bs}; use more data or --batch-size")
    stop = steps if args.stop_after is None else min(steps, args.stop_after)
    every = args.save_every or p.save_every
    bar = tqdm(range(info["step"], stop), initial=info["step"], total=steps, disable=not args.progress,
               desc=f"train {args.arch}/{args.preset} seed {args.seed}", dynamic_ncols=True)
    model.train()
    scaler = _scaler(args, info)
    for step in bar:
        idx = batch_indices(n, bs, args.seed, step)
        lr = lr_at(step, steps, p, lr0, info["run"]["warmup"])
        info["losses"].append(_step(model, opt, {k: v[idx] for k, v in items.items()}, lr, p.clip, DTYPES[args.dtype],
                                    scaler))
        info["position"] = {"epoch": (step + 1) // (n // bs), "batch": (step + 1) % (n // bs)}
        if scaler is not None:
            info["scaler"] = scaler.state_dict()
        bar.set_postfix(loss=f"{info['losses'][-1]:.4f}", lr=f"{lr:.2e}")
        if (step + 1) % every == 0 or step + 1 == stop:
            save_state(model, opt, step + 1, info, state_dir, skeleton)
    bar.close()
    info["step"] = stop
    return info


def _final_eval(model, skeleton: Path, args: TrainArgs, bs: int, context: int | None) -> dict:
    from ..data.batches import batched
    from ..evaluation.forward import evaluate

    out = {}
    for split in ("validation", "test"):
        out[split] = evaluate(model, batched(load_items(skeleton, args.data, split, context), bs))
    return out


def train(args: TrainArgs) -> Path:
    """Train (or resume) and write a stock HF checkpoint to `args.out`; returns the path."""
    p = reshaped(args.arch, get_preset(args.arch, args.preset), args.shape)
    out = Path(args.out)
    created = not out.exists()
    skeleton, info = _prepare(args, p, out)
    state_dir = out / STATE
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _run(args, p, out, skeleton, info, state_dir, deterministic)
    except BaseException:  # a fresh run that saved no state yet (a full disk at the first save) leaves nothing
        if created and not (state_dir / "state.json").is_file():
            _remove_empty(out)
        raise


def _remove_empty(out: Path) -> None:
    """Remove OUT (made by this run) when nothing of it was saved: empty, or holding empty folders only."""
    if out.is_dir() and not any(f.is_file() for f in out.rglob("*")):
        shutil.rmtree(out, ignore_errors=True)


def _run(args: TrainArgs, p: Preset, out: Path, skeleton: Path, info: dict | None, state_dir: Path,
         deterministic: bool) -> Path:
    try:
        if info is None:
            model, opt, items, info = _start(args, p, skeleton, state_dir)
        else:
            model = _new_model(args, skeleton)
            opt = _optimizer(model, p, args.lr or p.lr)
            info = load_state(model, opt, state_dir)
            if info["threads"] != torch.get_num_threads():
                print(f"symmerge train: warning: the run started with {info['threads']} threads, resuming with "
                      f"{torch.get_num_threads()}; results may differ in the last bits (pass --threads "
                      f"{info['threads']})", file=sys.stderr)
            items = load_items(skeleton, args.data, "train", p.context or None)
        skeleton = state_dir / SKELETON
        t0 = time.time()
        info = _loop(args, p, model, opt, items, state_dir, skeleton, info)
        info["wall_s"] += time.time() - t0
        if info["step"] < info["run"]["steps"]:
            return out  # interrupted on purpose (stop_after): the state is saved, no model written
        model.eval()
        evals = _final_eval(model, skeleton, args, info["run"]["batch_size"], p.context or None)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    _write_output(model, out, skeleton, args, p, info, evals)
    return out


def _write_output(model, out: Path, skeleton: Path, args: TrainArgs, p: Preset, info: dict, evals: dict) -> None:
    tail = info["losses"][-50:]
    record = {"train": info["run"] | {
        "hf_class": HF_CLASSES[args.arch], "preset_values": p.to_json(), "data": str(args.data),
        "data_resolved": args.data if args.data == "digits" else str(Path(args.data).resolve()),
        "gpt2_bpe": args.gpt2_bpe, "steps_done": info["step"], "n_train_items": info["n_train"],
        "threads": info["threads"], "torch": torch.__version__, "wall_s": round(info["wall_s"], 1),
        "device": args.device, "dtype": args.dtype,
        "final_train_loss": sum(tail) / len(tail), "validation": evals["validation"], "test": evals["test"],
    }}
    with AtomicFolder(out) as tmp:
        model.to("cpu").save_pretrained(str(tmp))
        for name in SIDE:
            if (skeleton / name).is_file():
                shutil.copy2(skeleton / name, tmp / name)
        write_metadata(tmp, record)
        shutil.copytree(out / STATE, tmp / STATE)
