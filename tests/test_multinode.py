"""More than one node: two torchrun agents on this machine (`--nnodes 2 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT`, one process each, gloo) run `symmerge align --method dual` with the
endpoints sharded across the two "nodes" and take the one-process steps (float32, 1e-5 relative;
negative control: half of each batch in one process). The first process alone writes OUT.
"""

from __future__ import annotations

import subprocess

from dist_common import align, env, free_port, takes_one_process_steps, torchrun


def test_two_agents_take_the_single_process_steps(dist_pair, one_process, half_rows, tmp_path):
    port = free_port()
    argv = align(*dist_pair, tmp_path / "out", "--shard-endpoints", "--json", str(tmp_path / "out.json"))
    agent = torchrun("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                     f"127.0.0.1:{port}", "--rdzv-id", "symmerge-two-nodes", "-m", "symmerge", *argv)
    agents = [subprocess.Popen(agent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env())
              for _ in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in agents]
    finally:
        for p in agents:
            p.kill()
    assert [p.returncode for p in agents] == [0, 0], [err[-3000:] for _, err in outs]
    assert sum(out.count("wrote ") for out, _ in outs) == 1, outs  # the first process alone writes
    takes_one_process_steps(tmp_path / "out", tmp_path / "out.json", one_process, half_rows)
