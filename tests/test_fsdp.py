"""Sharded endpoints on FSDP2 (`match/sharded.py`, `align --shard-endpoints [K]`) under torchrun (gloo).

- The store: every part a sharded endpoint gives equals the whole store's bit for bit, in the
  checkpoint's dtype and in bfloat16, over every process (a 1-D mesh) and over groups of 2 (a 2 x 2 mesh,
  replicated across the groups); each process keeps about 1/K of the endpoint; the next block's gather is
  started ahead in the forward's order and in the backward's (its recomputation).
- The command line: a mesh larger than the one process started is refused with one line. Under torchrun,
  `align --method dual --shard-endpoints` is tested in test_distributed.py, in its one launch of the
  command lines: it writes what one process writes, and a mesh that does not divide the processes is
  refused with one line, exit != 0, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dist_common import HERE, align, env, torchrun


def _orders(n: int) -> dict[str, list]:
    """The parts the block-wise forward asks for (the ends' materialisation, the embedding's rows, the
    blocks, the head), and those its checkpointed backward recomputes (head, blocks in reverse, the ends)."""
    return {"forward": ["embed", "final", "embed", *range(n), "final"],
            "backward": ["final", *range(n - 1, -1, -1), "embed", "final"]}


def _worker(spec: dict) -> int:
    from symmerge.match.frozen import Frozen
    from symmerge.match.sharded import Sharded
    from symmerge.runtime import distributed
    from symmerge.store.model import load_model

    group = distributed.init("cpu")
    a, b = load_model(spec["a"]), load_model(spec["b"])
    out = {}
    for size in (group.world, 2):
        for dtype in (None, torch.bfloat16):
            group.shard = size
            sharded, whole, other = Sharded(a, group, dtype=dtype), Frozen(a, dtype=dtype), Frozen(b, dtype=dtype)
            seen = {}
            for order, keys in _orders(a.shape.n_layers).items():
                before = sharded.prefetched
                same = differs = True
                for key in keys:
                    got = sharded.part(key)
                    same &= got.keys() == whole.part(key).keys() and all(
                        torch.equal(v, whole.part(key)[k]) and v.dtype == whole.part(key)[k].dtype for k, v in got.items())
                    differs &= any(v.dim() > 0 and not torch.equal(v, other.part(key)[k]) for k, v in got.items())
                seen[order] = {"equal": same, "differs_from_b": differs, "prefetched": sharded.prefetched - before}
            out[f"{size}.{dtype}"] = {**seen, "kept": sharded.nbytes(), "whole": whole.nbytes()}
    Path(f"{spec['out']}.rank{group.rank}.json").write_text(json.dumps(out))
    distributed.close()
    return 0


@pytest.fixture(scope="module")
def stores(dist_pair, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp-store")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"a": str(dist_pair[0]), "b": str(dist_pair[1]), "out": str(tmp / "store")}))
    proc = subprocess.run(torchrun("--standalone", "--nproc-per-node", "4", __file__, str(spec)),
                          capture_output=True, text=True, timeout=400, env=env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp / f"store.rank{r}.json").read_text()) for r in range(4)]


def test_sharded_parts_equal_the_whole_store(stores):
    for rank in stores:
        for case, r in rank.items():
            for order in ("forward", "backward"):
                assert r[order]["equal"], (case, order)
                assert r[order]["differs_from_b"], (case, order)  # negative control: the comparison can fail


def test_each_process_keeps_one_share(stores):
    """1/K of the endpoint per process, K = 4 (every process) or 2 (2 x 2 mesh); FSDP2 pads axis 0 of a
    tensor that K does not divide (at most a row per tensor), and the scalars stay whole."""
    for rank in stores:
        for case, r in rank.items():
            k = int(case.split(".")[0])
            assert r["whole"] / k <= r["kept"] <= r["whole"] / k * 1.1 + 1024, (case, r)


def test_the_next_block_is_gathered_ahead(stores, dist_pair):
    """Forward: every block was prefetched (block 0 after the embeddings); backward: every block but the
    last, whose gather follows the head."""
    from symmerge.store.model import LazyModel

    n = LazyModel(dist_pair[0]).shape.n_layers
    for rank in stores:
        for case, r in rank.items():
            assert (r["forward"]["prefetched"], r["backward"]["prefetched"]) == (n, n - 1), case


def test_a_mesh_larger_than_one_process_is_refused(dist_pair, tmp_path, capsys):
    from symmerge.cli import main

    assert main(align(*dist_pair, tmp_path / "out", "--shard-endpoints", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not divide the 1 process started" in err[0], err
    assert list(tmp_path.iterdir()) == []


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(_worker(json.loads(Path(sys.argv[1]).read_text())))
