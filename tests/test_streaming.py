"""Block-at-a-time export equals the in-memory export; sharded and half-precision checkpoints read and write."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from safetensors.torch import load_file

from factories import example_inputs, logits, make_model
from symmerge.algebra.apply import apply
from symmerge.algebra.elements import random_element
from symmerge.match.outputs import write_element
from symmerge.store.model import LazyModel, load_model
from symmerge.store.stream import write_streaming


def _all_tensors(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "vit"])
def test_streaming_equals_in_memory_and_shards(arch, model_dirs, tmp_path):
    lazy = LazyModel(model_dirs[arch])
    g = random_element(lazy.spec, torch.Generator().manual_seed(0))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "s", max_shard_bytes=20_000, progress=False)
    model = load_model(model_dirs[arch])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the in-memory path at another thread count than the streamed one's: same bytes
    try:
        write_element(model, g, tmp_path / "m")
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "s" / "model.safetensors.index.json").is_file(), "expected several shards"
    streamed, in_memory = _all_tensors(tmp_path / "s"), _all_tensors(tmp_path / "m")
    assert set(streamed) == set(in_memory)
    for k in streamed:
        assert torch.equal(streamed[k], in_memory[k]), k
    source = _all_tensors(model_dirs[arch])  # negative control: the element moved the weights
    assert any(not torch.equal(streamed[k], source[k]) for k in streamed if k in source and streamed[k].dim() == 2)
    a = json.loads((tmp_path / "s" / "config.json").read_text())
    b = json.loads((tmp_path / "m" / "config.json").read_text())
    assert a == b


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sharded_half_precision_checkpoint(dtype, tmp_path):
    src = make_model("llama", dtype=torch.float32).to(dtype)
    src.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    assert (tmp_path / "src" / "model.safetensors.index.json").is_file()
    lazy = LazyModel(tmp_path / "src")
    assert lazy.dtype == dtype
    g = random_element(lazy.spec, torch.Generator().manual_seed(1))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "out", progress=False)
    out = T.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert next(out.parameters()).dtype == dtype
    ref = logits(src.float(), example_inputs("llama"))
    new = logits(out.float(), example_inputs("llama"))
    # half precision storage: rounding of the rotated weights dominates
    assert float((new - ref).abs().max()) < 0.05 * float(ref.abs().max())
    # negative control: an unrotated embedding breaks it
    sd = out.state_dict()
    sd["model.embed_tokens.weight"] = src.state_dict()["model.embed_tokens.weight"]
    out.load_state_dict(sd)
    assert float((logits(out.float(), example_inputs("llama")) - ref).abs().max()) > 0.1 * float(ref.abs().max())


# --- streaming weight matching ----------------------------------------------------------------------


class _CountingSource:
    """A LazyModel whose parts are tracked: how many are alive at once, and how many were read."""

    def __init__(self, lazy):
        self.lazy, self.alive, self.peak, self.reads = lazy, 0, 0, 0

    def part(self, key):
        import weakref

        class Part(dict):
            pass

        p = Part(self.lazy.part(key))
        self.alive += 1
        self.peak, self.reads = max(self.peak, self.alive), self.reads + 1
        weakref.finalize(p, self._free)
        return p

    def _free(self):
        self.alive -= 1


def _deep_gpt2(tmp_path, name, seed, layers=6):
    torch.manual_seed(seed)
    cfg = T.GPT2Config(n_embd=32, n_layer=layers, n_head=4, vocab_size=61, n_positions=16, bos_token_id=0, eos_token_id=0)
    m = T.GPT2LMHeadModel(cfg).to(torch.float64)
    m.save_pretrained(tmp_path / name)
    return tmp_path / name


def test_streaming_weight_matching_equals_in_memory_and_holds_one_part(tmp_path):
    """Reading part by part gives the in-memory result exactly; with one block solved at a time, at most two
    parts of a model are alive at once."""
    from symmerge.match.weight import weight_match

    a, b = _deep_gpt2(tmp_path, "a", 0), _deep_gpt2(tmp_path, "b", 1)
    A, B = load_model(a), load_model(b)
    in_memory = weight_match(A.spec, A.params, B.params, max_iters=3)
    src_a, src_b = _CountingSource(LazyModel(a)), _CountingSource(LazyModel(b))
    streamed = weight_match(A.spec, src_a, src_b, max_iters=3, workers=1)
    assert streamed.history == in_memory.history
    assert in_memory.history[-1] > in_memory.history[0] + 0.05  # it did something
    assert all(torch.equal(streamed.g[k], in_memory.g[k]) for k in in_memory.g)
    # negative control: one sweep fewer (a skipped step) gives another element
    short = weight_match(A.spec, A.params, B.params, max_iters=2)
    assert short.history != in_memory.history and not all(torch.equal(short.g[k], in_memory.g[k]) for k in in_memory.g)
    parts, sweeps = A.shape.n_layers + 2, len(streamed.history) - 1
    # the start pass reads every part, each sweep only the blocks (the ends' statistics never change)
    assert src_a.reads == src_b.reads == parts + A.shape.n_layers * sweeps
    assert src_a.peak <= 2 and src_b.peak <= 2, (src_a.peak, src_b.peak)


def test_weight_matching_float32_recovers_planted_element(tmp_path):
    """float32 algebra (for large models) still recovers a planted element to 1e-5, from a bf16-free fp32 checkpoint."""
    from symmerge.match.weight import weight_match

    a = _deep_gpt2(tmp_path, "a", 0, layers=3)
    lazy = LazyModel(a, torch.float32)
    g = random_element(lazy.spec, torch.Generator().manual_seed(3))
    write_streaming(lazy, lambda part: apply(lazy.spec, g, part), tmp_path / "b", dtype=torch.float32, progress=False)
    res = weight_match(lazy.spec, lazy, LazyModel(tmp_path / "b", torch.float32), None, max_iters=6, dtype=torch.float32)
    A, B = load_model(a), load_model(tmp_path / "b")
    moved = apply(A.spec, res.g, B.params)
    rel = lambda x: (sum(float(((x[k] - A.params[k]) ** 2).sum()) for k in A.params) /  # noqa: E731
                     sum(float((A.params[k] ** 2).sum()) for k in A.params)) ** 0.5
    assert rel(B.params) > 0.1
    assert rel(moved) <= 1e-5
    assert res.history[-1] > 1 - 1e-6


def test_cli_align_streams_sharded_half_precision(tmp_path):
    """`align` on sharded bf16 checkpoints: OUT is sharded, bf16, and computes B's function (planted pair)."""
    from symmerge import cli

    src = make_model("llama", dtype=torch.float32).to(torch.bfloat16)
    src.save_pretrained(tmp_path / "a", max_shard_size="20KB")
    assert cli.main(["transform", str(tmp_path / "a"), "-o", str(tmp_path / "b"), "--seed", "2"]) == 0
    assert cli.main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "c"), "--precision",
                     "float32", "--groups", "all", "--json", str(tmp_path / "r.json")]) == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["objective"][-1] > 0.99 > 0.5 > rep["objective"][0]
    out = T.LlamaForCausalLM.from_pretrained(tmp_path / "c").eval()
    assert next(out.parameters()).dtype == torch.bfloat16
    x = example_inputs("llama")
    b = T.LlamaForCausalLM.from_pretrained(tmp_path / "b").eval()
    ref_b, ref_a, new = (logits(m.float(), x) for m in (b, src, out))
    scale = float(ref_b.abs().max())
    assert float((new - ref_b).abs().max()) < 0.05 * scale  # B's function, up to bf16 rounding of the output
    # and OUT is (nearly) A's weights again: the planted element was undone
    sa, sc = src.state_dict(), out.state_dict()
    k = "model.layers.0.mlp.down_proj.weight"
    assert float((sa[k].float() - sc[k].float()).norm() / sa[k].float().norm()) < 0.05
    sb = b.state_dict()
    assert float((sa[k].float() - sb[k].float()).norm() / sa[k].float().norm()) > 0.5  # negative control



def test_weight_matching_device_cpu_equals_the_default(tmp_path):
    """`align --method weight --device cpu` (the products and Procrustes solves placed on a named device) writes
    what the default writes, and the report says where they ran; `weight_match(device=...)` equals no device.
    (Where `cuda` is named without a GPU the command refuses: tests/test_bad_input.py.)"""
    from symmerge import cli
    from symmerge.match.weight import weight_match

    a, b = _deep_gpt2(tmp_path, "a", 0, layers=2), _deep_gpt2(tmp_path, "b", 1, layers=2)
    A, B = load_model(a), load_model(b)
    plain = weight_match(A.spec, A.params, B.params, max_iters=2)
    placed = weight_match(A.spec, A.params, B.params, max_iters=2, device="cpu")
    assert placed.history == plain.history and plain.history[-1] > plain.history[0]
    assert all(torch.equal(placed.g[k], plain.g[k]) for k in plain.g)
    # negative control: the same products in float32 (a lost float64 cast) are not the same bits
    single = weight_match(A.spec, A.params, B.params, max_iters=2, dtype=torch.float32)
    assert single.history != plain.history
    outs = {}
    for name, extra in (("default", []), ("cpu", ["--device", "cpu"])):
        argv = ["align", str(a), str(b), "-o", str(tmp_path / name), "--max-iters", "2", "--json",
                str(tmp_path / f"{name}.json"), *extra]
        assert cli.main(argv) == 0
        outs[name] = _all_tensors(tmp_path / name)
    assert json.loads((tmp_path / "cpu.json").read_text())["device"] == "cpu"
    assert outs["cpu"].keys() == outs["default"].keys()
    if torch.cuda.is_available():  # the default is the GPU: its products sum in another order
        assert json.loads((tmp_path / "default.json").read_text())["device"].startswith("cuda")
        assert all(torch.allclose(outs["cpu"][k], outs["default"][k], rtol=1e-4, atol=1e-6) for k in outs["default"])
    else:
        assert all(torch.equal(outs["cpu"][k], outs["default"][k]) for k in outs["default"])
    # negative control: B's own tensors (the alignment skipped) are not what either wrote
    unaligned = _all_tensors(b)
    assert any(not torch.allclose(outs["cpu"][k], v, rtol=1e-4, atol=1e-6) for k, v in unaligned.items() if k in outs["cpu"])


def test_weight_matching_workers_give_the_same_bits(tmp_path):
    """Blocks solved concurrently (`workers`) give exactly the one-worker element and objective, in memory and
    streamed, with at most `workers` + 1 parts of a model alive; torch's thread count is restored after; and
    `align --sweep-workers 2` writes the same tensors as the default."""
    from symmerge import cli
    from symmerge.match.weight import weight_match

    a, b = _deep_gpt2(tmp_path, "a", 0, layers=4), _deep_gpt2(tmp_path, "b", 1, layers=4)
    A, B = load_model(a), load_model(b)
    one = weight_match(A.spec, A.params, B.params, max_iters=3)
    assert one.history[-1] > one.history[0] + 0.05  # it did something
    threads = torch.get_num_threads()
    for workers in (2, 3):
        res = weight_match(A.spec, A.params, B.params, max_iters=3, workers=workers)
        assert res.history == one.history and res.steps == one.steps
        assert all(torch.equal(res.g[k], one.g[k]) for k in one.g)
        src_a, src_b = _CountingSource(LazyModel(a)), _CountingSource(LazyModel(b))
        streamed = weight_match(A.spec, src_a, src_b, max_iters=3, workers=workers)
        assert streamed.history == one.history
        assert all(torch.equal(streamed.g[k], one.g[k]) for k in one.g)
        assert src_a.peak <= workers + 1 and src_b.peak <= workers + 1, (workers, src_a.peak, src_b.peak)
        assert torch.get_num_threads() == threads
    # negative control: one sweep fewer is a different element, so the equalities above compare real work
    fewer = weight_match(A.spec, A.params, B.params, max_iters=2, workers=2)
    assert fewer.history != one.history
    outs = {}
    for name, extra in (("one", []), ("two", ["--sweep-workers", "2"])):
        assert cli.main(["align", str(a), str(b), "-o", str(tmp_path / name), "--max-iters", "3", *extra]) == 0
        outs[name] = _all_tensors(tmp_path / name)
    assert outs["one"].keys() == outs["two"].keys()
    assert all(torch.equal(outs["one"][k], outs["two"][k]) for k in outs["one"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_read_tensor_is_the_readers_own(dtype, tmp_path):
    """`LazyModel.get` returns a tensor of the caller's own, also where the checkpoint already holds the reading
    precision (the adapters scale a read head in place): a change to one read leaves the next read, the tied
    embedding behind the head, and the file as they were. Control: safetensors' own reads of one open file share
    their memory, so an in-place change to one is seen by the other."""
    from safetensors import safe_open

    folder = tmp_path / "m"
    make_model("llama", seed=0).to(dtype).save_pretrained(folder)  # the factory's Llama is tied
    lazy = LazyModel(folder, dtype=dtype)
    name = "model.embed_tokens.weight"
    first = lazy.get(name)
    want = first.clone()
    first.mul_(3.0)
    assert torch.equal(lazy.get(name), want)
    head, embed = lazy.part("final")["head.W_U"], lazy.part("embed")["embed.W_E"]
    gamma = lazy.get("model.norm.weight")
    assert torch.equal(embed, want) and torch.allclose(head, want * gamma, rtol=0, atol=0)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        x, y = f.get_tensor(name), f.get_tensor(name)
        x.mul_(3.0)
        assert torch.equal(y, x)
