"""Several processes: learned and dual matching under torchrun (2 gloo processes on the CPU).

Each test launches `python -m torch.distributed.run --standalone --nproc-per-node 2` on this file (its
`__main__` part is the worker: it runs `learn` and writes what every rank holds) or on `-m symmerge`,
and compares with a single process over the same global batches: the group parameters after k steps
agree to 1e-5 relative (float32 forward), the ranks agree bitwise, a resumed run equals an
uninterrupted one bitwise, a rank that dies or hangs ends the others with one clear error within the
timeout, and bad input is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_common import CHARS, HERE, align, env, launch_cli, load, outputs_rel, rel, takes_one_process_steps, torchrun


def _train_val():
    """Global batches of 4 rows; some labels of the first two rows (rank 0's) are -100, so the ranks'
    shares of the predicted tokens differ and an unweighted mean of their losses would be wrong."""
    from factories import lm_batches

    train, val = lm_batches(3, 0), lm_batches(2, 1)
    for b in (train[0], train[2], val[0]):
        b["labels"][0, 2:9] = -100
    return train, val


def _config(method: str, steps: int = 6, sampling: str = "uniform"):
    """Uniform λ unless told: peak's grid point follows the validation curve, whose last bits differ between one
    process and two (a near tie can pick another point), so only uniform runs are compared with one process's."""
    from learned_common import quick

    return quick(method=method, steps=steps, seed=3, lam_range=(0.2, 0.8), lam_sampling=sampling)


def _init(b, method: str):
    from symmerge.algebra.elements import random_element

    return random_element(b.spec, torch.Generator().manual_seed(7 if method == "learned" else 8))


# --- the worker (run by torchrun on this file) -----------------------------------------------------------


def _worker(spec: dict) -> int:
    from safetensors.torch import save_file

    from factories import nudged_copy
    from symmerge import SymmergeError
    from symmerge.match.learn_loop import Interrupted
    from symmerge.match.learned import learn
    from symmerge.runtime import distributed
    from symmerge.store.model import load_model

    group = distributed.init("cpu")
    a, b = load_model(spec["a"]), load_model(spec["b"])
    train, val = _train_val()
    for run in spec["runs"]:
        taken = []  # the steps this run takes (a resume: only those after its checkpoint)

        def on_step(step, run=run, taken=taken):
            taken.append(step)
            if group.main:
                Path(f"{run['out']}.steps.json").write_text(json.dumps(taken))
            if group.rank == 1 and step == run.get("die_at"):
                os._exit(3)
            if group.rank == 1 and step == run.get("hang_at"):
                time.sleep(3600)  # until torchrun ends it, after rank 0 gave up
            return step == run.get("stop_at")

        ckpt = run.get(f"ckpt_rank{group.rank}", run["ckpt"])
        if "nudge" in run:  # each rank its own copy of the checkpoint rank 0 wrote, once it is written
            group.agree(lambda: None)
            ckpt = nudged_copy(Path(run["nudge"]), Path(f"{run['ckpt']}.rank{group.rank}"), "state.safetensors", "param.")
        group.shard = run.get("shard", 0)
        try:
            res = learn(a, b, train, val, _config(run["method"], sampling=run.get("sampling", "uniform")),
                        init=_init(b, run["method"]), checkpoint=ckpt,
                        resume=run.get("resume", False), on_step=on_step)
        except Interrupted:
            continue
        except SymmergeError as e:
            print(f"worker: error: {e}", file=sys.stderr)
            Path(f"{run['out']}.error.rank{group.rank}").write_text(str(e))
            if run.get("expect_error"):
                continue
            return 2
        flat = {f"{side}.{k}": v.contiguous() for side, g in res.elements.items() for k, v in g.items()}
        save_file(flat, f"{run['out']}.rank{group.rank}.safetensors")
        if group.main:
            Path(f"{run['out']}.history.json").write_text(json.dumps(res.report["history"]))
    if any(run.get("shard") for run in spec["runs"]):  # what one rank keeps of an endpoint, sharded and whole
        from symmerge.match.frozen import Frozen
        from symmerge.match.sharded import Sharded

        group.shard = 2
        kept = {"sharded": Sharded(a, group).nbytes(), "whole": Frozen(a).nbytes()}
        Path(f"{spec['runs'][0]['out']}.bytes.rank{group.rank}.json").write_text(json.dumps(kept))
    distributed.close()
    return 0


# --- the tests -------------------------------------------------------------------------------------------


def _launch(*target: str, timeout: float = 400, **extra) -> subprocess.CompletedProcess:
    """torchrun with 2 processes (gloo) on this file, with its arguments."""
    cmd = torchrun("--standalone", "--nproc-per-node", "2", *target)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra))


def _work(tmp: Path, dirs, runs: list[dict], name: str = "spec.json", **extra) -> subprocess.CompletedProcess:
    spec = tmp / name
    spec.write_text(json.dumps({"a": str(dirs[0]), "b": str(dirs[1]), "runs": runs}))
    return _launch(__file__, str(spec), **extra)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """The random pair: `learn` on random tokens and the merge of three, which learn from their start on it."""
    from dist_common import make_pair

    return make_pair(tmp_path_factory.mktemp("random-pair"), steps=0)


@pytest.fixture(scope="module")
def launched(dirs, tmp_path_factory):
    """One launch (process start-up is most of a test's time): learned and dual to the end; learned stopped
    at step 3 and resumed from a nudged copy of rank 0's checkpoint, then from the checkpoint itself; a
    resume where rank 1 finds no checkpoint."""
    tmp = tmp_path_factory.mktemp("dist-runs")
    runs = [{"method": "learned", "ckpt": str(tmp / "learned.state"), "out": str(tmp / "learned")},
            {"method": "dual", "ckpt": str(tmp / "dual.state"), "out": str(tmp / "dual")},
            {"method": "learned", "ckpt": str(tmp / "learned-sharded.state"), "out": str(tmp / "learned-sharded"), "shard": 2},
            {"method": "dual", "ckpt": str(tmp / "dual-sharded.state"), "out": str(tmp / "dual-sharded"), "shard": 2},
            {"method": "dual", "ckpt": str(tmp / "dual-peak.state"), "out": str(tmp / "dual-peak"), "sampling": "peak"},
            {"method": "learned", "ckpt": str(tmp / "cut.state"), "out": str(tmp / "cut"), "stop_at": 3},
            {"method": "learned", "ckpt": str(tmp / "nudged.state"), "nudge": str(tmp / "cut.state"), "out": str(tmp / "nudged"),
             "resume": True},
            {"method": "learned", "ckpt": str(tmp / "cut.state"), "out": str(tmp / "resumed"), "resume": True},
            {"method": "learned", "ckpt": str(tmp / "learned.state"), "ckpt_rank1": str(tmp / "nowhere"),
             "out": str(tmp / "lost"), "resume": True, "expect_error": True}]
    proc = _work(tmp, dirs, runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def _flat(res) -> dict:
    return {f"{side}.{k}": v for side, g in res.elements.items() for k, v in g.items()}


@pytest.mark.parametrize("method", ["learned", "dual", "learned-sharded", "dual-sharded"])
def test_two_processes_take_the_single_process_step(dirs, launched, tmp_path, method):
    """Data parallel, and with the endpoints sharded over the ranks (`match/sharded.py`): the group
    parameters, outside the sharding, are still summed over the ranks and equal one process's."""
    from symmerge.match.learned import learn
    from symmerge.store.model import load_model

    a, b = load_model(dirs[0]), load_model(dirs[1])
    train, val = _train_val()
    run, kind = method, method.split("-")[0]
    single = learn(a, b, train, val, _config(kind), init=_init(b, kind), checkpoint=tmp_path / "state")
    ranks = [load(launched / f"{run}.rank{r}.safetensors") for r in (0, 1)]
    for k in ranks[0]:  # every rank holds the same element, bit for bit
        assert torch.equal(ranks[0][k], ranks[1][k]), k
    assert rel(ranks[0], _flat(single)) < 1e-5
    # the group parameters and Adam's moments after the last step (the checkpoint rank 0 wrote)
    assert rel(load(launched / f"{run}.state" / "state.safetensors"), load(tmp_path / "state" / "state.safetensors")) < 1e-5
    history = json.loads((launched / f"{run}.history.json").read_text())
    assert [h["step"] for h in history] == [h["step"] for h in single.report["history"]]
    for h, s in zip(history, single.report["history"]):
        assert h["losses"] == pytest.approx(s["losses"], rel=1e-5)
    # negative control: the first rank's rows alone (no all-reduce) take another step
    half = [{k: v[:2] for k, v in batch.items()} for batch in train]
    alone = learn(a, b, half, val, _config(kind), init=_init(b, kind))
    assert rel(ranks[0], _flat(alone)) > 1e-3
    if run.endswith("sharded"):  # the data-parallel run, bit for bit: a gather moves bytes
        for k, v in load(launched / f"{kind}.rank0.safetensors").items():
            assert torch.equal(v, ranks[0][k]), k


def test_two_processes_draw_the_same_peak_lambdas(launched):
    """Peak λ sampling (the default for pairs) under torchrun: every rank draws from the all-reduced validation
    curve, so the ranks hold one element, bit for bit, and it learned (it differs from the uniform run's)."""
    ranks = [load(launched / f"dual-peak.rank{r}.safetensors") for r in (0, 1)]
    for k in ranks[0]:
        assert torch.equal(ranks[0][k], ranks[1][k]), k
    assert rel(ranks[0], load(launched / "dual.rank0.safetensors")) > 0


def test_sharded_endpoints_keep_half_on_each_rank(launched):
    kept = [json.loads((launched / f"learned.bytes.rank{r}.json").read_text()) for r in (0, 1)]
    for k in kept:
        assert k["sharded"] <= k["whole"] / 2 + 64 * 8, kept  # padding: under one element per part and rank


def test_resume_under_torchrun_equals_uninterrupted(launched):
    """Stopped at step 3 (rank 0 wrote the checkpoint), resumed by both ranks: bitwise the uninterrupted run."""
    assert not list(launched.glob("cut.rank*"))  # the cut run stopped (Interrupted) before it returned
    whole, resumed = load(launched / "learned.rank0.safetensors"), load(launched / "resumed.rank0.safetensors")
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    assert (launched / "resumed.history.json").read_text() == (launched / "learned.history.json").read_text()
    for k, v in load(launched / "learned.state" / "state.safetensors").items():
        assert torch.equal(v, load(launched / "cut.state" / "state.safetensors")[k]), k
    # negative control (learning is deterministic: a resume that ignored its checkpoint and started again
    # would equal the uninterrupted run too): the resume takes only the steps after the cut, and one from a
    # copy of the checkpoint with a parameter moved ends elsewhere
    taken = {n: json.loads((launched / f"{n}.steps.json").read_text()) for n in ("learned", "cut", "resumed", "nudged")}
    assert taken == {"learned": [1, 2, 3, 4, 5, 6], "cut": [1, 2, 3], "resumed": [4, 5, 6], "nudged": [4, 5, 6]}, taken
    nudged = load(launched / "nudged.state.rank0" / "state.safetensors")
    params = {k: v for k, v in load(launched / "learned.state" / "state.safetensors").items() if k.startswith("param.")}
    assert rel({k: nudged[k] for k in params}, params) > 1e-4


def test_a_rank_without_the_checkpoint_stops_every_rank(launched):
    """Rank 1 finds no checkpoint to resume: both ranks raise the same error (rank 0 names rank 1)."""
    texts = [(launched / f"lost.error.rank{r}").read_text() for r in (0, 1)]
    assert texts[0] == texts[1] and texts[0].startswith("rank 1: no learned-matching checkpoint in"), texts
    assert not list(launched.glob("lost.rank*"))


@pytest.mark.parametrize("fault", ["die_at", "hang_at"])
def test_a_rank_that_dies_or_hangs_ends_the_others(dirs, tmp_path, fault):
    """Rank 1 exits (or sleeps) at step 2: torchrun exits != 0, not a hang. A sleeping rank 1 makes rank 0
    stop with one clear error after the process group's timeout (5 s here); an exiting one, too, unless
    torchrun stops rank 0 first (it stops the others once one process fails)."""
    run = {"method": "learned", "ckpt": str(tmp_path / "state"), "out": str(tmp_path / "run"), fault: 2}
    proc = _work(tmp_path, dirs, [run], SYMMERGE_DIST_TIMEOUT="5")
    assert proc.returncode != 0
    if fault == "die_at":  # torchrun sees rank 1 exit and stops rank 0, or rank 0 sees the connection close first
        assert "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]
        if not (tmp_path / "run.error.rank0").exists():
            return
    error = (tmp_path / "run.error.rank0").read_text()
    assert error.startswith("rank 0: lost contact with the other processes during the gradient all-reduce"), error
    assert "SYMMERGE_DIST_TIMEOUT=5s" in error


def _merge(dirs, third, out, *extra) -> list[str]:
    """`merge` of the random pair and a third model on the pair's text (batches of 4)."""
    return ["merge", str(dirs[0]), str(dirs[1]), str(third), "-o", str(out), "--data", str(dirs[0].parent / "text.txt"),
            "--batch-size", "4", "--max-batches", "3", *extra]


#: the learned merge's settings (a few dual steps)
LEARNED_MERGE = ("--method", "dual", "--steps", "4", "--eval-every", "2", "--lr", "0.05", "--val-batches", "2")


@pytest.fixture(scope="module")
def commands(dist_pair, dirs, tmp_path_factory):
    """One launch of `python -m symmerge` command lines in 2 processes (process start-up is most of a launch's
    time), run in the pair's folder: `align --method dual` as it is, with batches of 3 rows (1 and 2 per rank)
    and of 1 row, and with rank 1 where the inputs are missing; with `--shard-endpoints`, and with a mesh of 3;
    `merge --method dual` of three models. Returns the folder, the pair's folder listing before the launch,
    the third model and every call's log by name."""
    from factories import make_model, save_model
    from symmerge.data.tokenizers import char_tokenizer

    tmp = tmp_path_factory.mktemp("commands")
    root, empty, bad = dist_pair[0].parent, tmp / "empty", tmp / "bad"
    empty.mkdir()
    bad.mkdir()
    third = save_model(make_model("gpt2", 2), tmp / "c")
    char_tokenizer(CHARS).save_pretrained(third)
    argvs = {"two": align(*dist_pair, tmp / "two", "--json", str(tmp / "two.json")),
             "odd": align(*dist_pair, tmp / "odd", "--batch-size", "3"),
             "one": align(*dist_pair, tmp / "one", "--batch-size", "1"),
             "lost": align("a", "b", tmp / "lost"),
             "sharded": align(*dist_pair, tmp / "sharded", "--shard-endpoints", "--json", str(tmp / "sharded.json")),
             "mesh": align(*dist_pair, bad / "out", "--shard-endpoints", "3"),
             "merge": _merge(dirs, third, tmp / "merge", *LEARNED_MERGE, "--json", str(tmp / "merge.json"))}
    calls = [{"argv": argv, "log": str(tmp / f"log-{name}"), **({"rank1_cwd": str(empty)} if name == "lost" else {})}
             for name, argv in argvs.items()]
    before = sorted(p.name for p in root.iterdir())
    _, logs = launch_cli(calls, root)
    return {"tmp": tmp, "root": root, "before": before, "third": third, "logs": dict(zip(argvs, logs))}


def _wrote_once(log: list[dict]) -> bool:
    """Rank 0 alone printed that it wrote the output."""
    return log[0]["stdout"].count("wrote ") == 1 and "wrote " not in log[1]["stdout"]


def test_align_under_torchrun(commands, dist_pair, one_process, half_rows):
    """`python -m symmerge align --method dual` in 2 processes writes what one process writes (rank 0
    alone writes), also where the processes take unequal parts of a batch (3 rows: 1 and 2); a batch with
    fewer rows than processes, and a rank without the input checkpoints, are refused with one line on rank 0,
    exit != 0 on every rank, nothing written."""
    from symmerge.cli import main

    tmp, logs = commands["tmp"], commands["logs"]
    ok, odd, one, lost = (logs[k] for k in ("two", "odd", "one", "lost"))
    assert [x["rc"] for x in ok] == [0, 0] and [x["rc"] for x in odd] == [0, 0], (ok, odd)
    assert _wrote_once(ok) and _wrote_once(odd), (ok, odd)
    takes_one_process_steps(tmp / "two", tmp / "two.json", one_process, half_rows)
    assert not (tmp / "two.learn-state").exists()
    assert main(align(*dist_pair, tmp / "odd-alone", "--batch-size", "3")) == 0
    assert outputs_rel(tmp / "odd", tmp / "odd-alone") < 1e-5
    assert outputs_rel(tmp / "odd", one_process / "out") > 1e-3  # the control: batches of 3 make other steps
    for log, words in ((one, "fewer than the 2 processes"), (lost, "rank 1: ")):
        assert [x["rc"] for x in log] == [2, 2], log
        assert words in log[0]["stderr"] and log[0]["stderr"].count("error:") == 1, log
        assert log[1]["stderr"] == "", log  # printed once, by rank 0
    assert "b is not a folder" in lost[0]["stderr"], lost
    assert not list(tmp.glob("one*.learn-state")) and not (tmp / "one").exists() and not (tmp / "lost").exists()
    assert sorted(p.name for p in commands["root"].iterdir()) == commands["before"]


def test_align_sharded_under_torchrun(commands, one_process, half_rows):
    """With the endpoints sharded on FSDP2 (`--shard-endpoints`, test_fsdp.py tests the store) the command
    takes the one-process steps; a mesh of 3 does not divide 2 processes: one line on rank 0, exit 2 on both,
    nothing written, no temporary folder."""
    tmp, ok, mesh = commands["tmp"], commands["logs"]["sharded"], commands["logs"]["mesh"]
    assert [x["rc"] for x in ok] == [0, 0] and _wrote_once(ok), ok
    takes_one_process_steps(tmp / "sharded", tmp / "sharded.json", one_process, half_rows)
    assert [x["rc"] for x in mesh] == [2, 2], mesh
    lines = mesh[0]["stderr"].strip().splitlines()
    assert len(lines) == 1 and "--shard-endpoints 3" in lines[0] and "does not divide the 2 processes" in lines[0], lines
    assert mesh[1]["stderr"] == ""
    assert list((tmp / "bad").iterdir()) == []


def test_merge_of_three_under_torchrun_takes_the_single_process_steps(commands, dirs, tmp_path):
    """`python -m symmerge merge --method dual` of three models in 2 processes (each its rows of every batch)
    writes what one process writes, to 1e-5 relative (float32 sums in another order); rank 0 alone writes.
    Negative control: the learned merge is not the weight-matching merge it started from."""
    from symmerge.cli import main

    tmp, log, third = commands["tmp"], commands["logs"]["merge"], commands["third"]
    assert [x["rc"] for x in log] == [0, 0] and _wrote_once(log), log
    assert main(_merge(dirs, third, tmp_path / "one", *LEARNED_MERGE, "--json", str(tmp_path / "one.json"))) == 0
    two, one = load(tmp / "merge" / "model.safetensors"), load(tmp_path / "one" / "model.safetensors")
    assert rel(two, one) < 1e-5
    r2, r1 = (json.loads(p.read_text()) for p in (tmp / "merge.json", tmp_path / "one.json"))
    assert [h["objective"] for h in r2["history"]] == pytest.approx([h["objective"] for h in r1["history"]], rel=1e-5)
    assert not (tmp / "merge.learn-state").exists()
    assert main(_merge(dirs, third, tmp_path / "weight")) == 0
    assert rel(load(tmp_path / "weight" / "model.safetensors"), one) > 1e-4


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(_worker(json.loads(Path(sys.argv[1]).read_text())))
