"""What the multi-process tests share (tests/test_distributed.py, test_fsdp.py, test_multinode.py): the
tiny GPT-2 pair with a character tokenizer and a text file, the environment and launch of torchrun (gloo
on the CPU), the `align --method dual` command line they run, and the comparison of outputs.

Run by torchrun as `dist_common.py --cli CALLS.json` it is the worker of `launch_cli`: `symmerge` command
lines one after the other in the same processes, each rank recording its exit code and stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TIMEOUT_S = 20  # the process group's timeout in these tests (SYMMERGE_DIST_TIMEOUT)
CHARS = "".join(chr(c) for c in range(65, 125))  # 60 characters: with <unk>, the tiny GPT-2s' 61 tokens


def make_pair(d: Path, steps: int = 100) -> tuple[Path, Path]:
    """The tiny GPT-2 pair in `d`/a and `d`/b, with a character tokenizer (for the command line), and
    `d`/text.txt (`markov_text`). The two are trained on the text for `steps` from different seeds
    (`trained`): after 100, their midpoint is worse than their ends after weight matching (a barrier of
    about 0.23 nats) and `align`'s few learned steps lower it, so that its best state is not its start
    and its outputs depend on every row of every batch. With 0: two random models (`make_model`) and
    uniform text, on which a learned merge of three moves from its start."""
    from factories import save_model
    from symmerge.data.tokenizers import char_tokenizer

    tok = char_tokenizer(CHARS)
    ids = markov_text(6000) if steps else torch.randint(0, len(CHARS), (6000,), generator=torch.Generator().manual_seed(0))
    out = save_model(trained(0, ids, steps), d / "a"), save_model(trained(1, ids, steps), d / "b")
    for path in out:
        tok.save_pretrained(path)
    (d / "text.txt").write_text("".join(CHARS[i] for i in ids))
    return out


def markov_text(n: int, seed: int = 0) -> torch.Tensor:
    """`n` token ids of CHARS, each the previous one's fixed successor 4 times in 5, else uniform."""
    gen = torch.Generator().manual_seed(seed)
    successor = torch.randperm(len(CHARS), generator=gen)
    keep, other = torch.rand(n, generator=gen) < 0.8, torch.randint(0, len(CHARS), (n,), generator=gen)
    ids = [0]
    for i in range(1, n):
        ids.append(int(successor[ids[-1]]) if keep[i] else int(other[i]))
    return torch.tensor(ids)


def trained(seed: int, ids: torch.Tensor, steps: int = 100):
    """`make_model("gpt2", seed)` after `steps` Adam steps (lr 3e-3) on batches of 8 windows of 32 ids
    drawn with `seed`."""
    from factories import make_model

    model = make_model("gpt2", seed).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.stack([ids[s:s + 32] for s in torch.randint(0, len(ids) - 32, (8,), generator=gen).tolist()])
        opt.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    return model.eval()


def env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "SYMMERGE_DIST_TIMEOUT": str(TIMEOUT_S),
            "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), os.environ.get("PYTHONPATH", "")]), **extra}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def align(a, b, out, *extra) -> list[str]:
    """`align --method dual` for a few steps on the pair's text (batches of 4); on `make_pair`'s pair the
    validation barrier falls at each evaluation (steps 2 and 4)."""
    return ["align", str(a), str(b), "-o", str(out), "--method", "dual", "--data", str(Path(a).parent / "text.txt"),
            "--steps", "4", "--eval-every", "2", "--val-points", "3", "--lr", "0.002", "--batch-size", "4",
            "--max-batches", "3", "--val-batches", "2", *extra]


def load(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def rel(x: dict, y: dict) -> float:
    """Largest relative distance over floating tensors; integer tensors (permutations) must be equal."""
    assert x.keys() == y.keys()
    for k in x:
        if not x[k].is_floating_point():
            assert torch.equal(x[k], y[k]), k
    return max(float((x[k] - y[k]).norm() / y[k].norm().clamp_min(1e-30)) for k in x if x[k].is_floating_point())


def outputs_rel(out: Path, ref: Path) -> float:
    """`rel` of dual matching's two outputs (OUT/A, OUT/B) against another run's."""
    return max(rel(load(out / s / "model.safetensors"), load(ref / s / "model.safetensors")) for s in ("A", "B"))


def last_losses(report: Path) -> list[float]:
    """The validation losses after the last step of a run's --json report."""
    return json.loads(Path(report).read_text())["history"][-1]["losses"]


def takes_one_process_steps(out: Path, report: Path, one_process: Path, half_rows: Path) -> None:
    """A multi-process run's outputs OUT and --json report equal those of the one-process run (conftest's
    `one_process`), to 1e-5 relative (float32 sums in another order). Negative controls: the one-process
    run's best state is not its start (its outputs are what the steps made of every row), and the first
    process's rows alone (`half_rows`) write other outputs and reach other losses."""
    import pytest

    ref = one_process / "out"
    assert outputs_rel(out, ref) < 1e-5
    one, many = (json.loads(Path(r).read_text()) for r in (one_process / "out.json", report))
    assert many["best_step"] == one["best_step"] > 0, (many["best_step"], one["best_step"])
    assert last_losses(report) == pytest.approx(last_losses(one_process / "out.json"), rel=1e-5)
    assert outputs_rel(half_rows / "out", ref) > 1e-3
    assert last_losses(half_rows / "out.json") != pytest.approx(last_losses(one_process / "out.json"), rel=1e-3)


def launch_cli(calls: list[dict], cwd: Path, nproc: int = 2, timeout: float = 400) -> tuple[subprocess.CompletedProcess, list]:
    """torchrun with `nproc` processes on `cli_calls` (each call: argv, log prefix, optional rank1_cwd);
    returns the launch and, per call, every rank's {rc, stdout, stderr}."""
    for call in calls:
        call["port"] = free_port()
    spec = Path(calls[0]["log"]).parent / "calls.json"
    spec.write_text(json.dumps(calls))
    proc = subprocess.run(torchrun("--standalone", "--nproc-per-node", str(nproc), __file__, "--cli", str(spec)),
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, [[json.loads(Path(f"{c['log']}.rank{r}.json").read_text()) for r in range(nproc)] for c in calls]


def cli_calls(calls: list[dict]) -> int:
    """`symmerge` command lines one after the other in the same processes; each rank records its exit
    code, stdout and stderr. With `rank1_cwd` rank 1 runs in that folder, where relative inputs are missing."""
    from symmerge.cli import main

    home, rank, world = os.getcwd(), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # each command meets the other ranks on a store of its own
    for call in calls:
        os.environ["MASTER_PORT"] = str(call["port"])
        # every rank starts each command together: rank 0 may still be writing the last one's outputs, for
        # longer than a rank waits to join (the process group's timeout)
        Path(f"{call['log']}.start{rank}").touch()
        while not all(Path(f"{call['log']}.start{r}").exists() for r in range(world)):
            time.sleep(0.05)
        os.chdir(call.get("rank1_cwd") or home if rank == 1 else home)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(call["argv"])
        os.chdir(home)
        Path(f"{call['log']}.rank{rank}.json").write_text(json.dumps({"rc": rc, "stdout": out.getvalue(),
                                                                      "stderr": err.getvalue()}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(cli_calls(json.loads(Path(sys.argv[2]).read_text())))
