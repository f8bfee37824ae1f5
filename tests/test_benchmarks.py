"""The benchmarks as a product: every benchmark script has a result file in one schema (`benchmarks/record.py`),
results keep no machine paths and no diary (dates, times, who ran what), and a rerun replaces its own record.

Each check has a negative control: a record that breaks the schema, a diary line, a machine path."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import record  # noqa: E402

#: files of benchmarks/ that are tools, not benchmarks (no result of their own)
TOOLS = {"record.py", "make_readme.py", "readme_figures.py", "doc_figures.py", "readme_runs.py", "figure_refs.py",
         "reproduction_summary.py", "rebuild_times.py", "midpoint_excess.py"}
#: a machine path, or a diary: a date, a time of day, a session or helper
DIARY = re.compile(r"/(?:work|tmp|root|home)/|\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d(?::\d\d)? UTC\b|\bsession\b|\bhelpers?\b",
                   re.I)


def _results() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (BENCH / "results").glob("*.json")}


def test_every_benchmark_script_has_a_result_in_the_schema():
    results = _results()
    assert {n: record.problems(r) for n, r in results.items() if record.problems(r)} == {}
    scripts = {p.name for p in BENCH.glob("*.py")} - TOOLS | {p.name for p in BENCH.glob("*.sh")}
    assert scripts - {Path(r["script"]).name for r in results.values()} == set()
    assert all(n == r["benchmark"] for n, r in results.items())
    # negative controls: a record without its commit, a short commit id, a table row of the wrong length
    bad = json.loads(json.dumps(results["assignment"]))
    del bad["records"][0]["commit"]
    assert any("commit" in p for p in record.problems(bad))
    bad["records"][0]["commit"] = "b4641fe"
    assert any("full commit id" in p for p in record.problems(bad))
    bad["records"][0]["tables"][0]["rows"][0].append("extra")
    assert any("row's length" in p for p in record.problems(bad))


def test_results_hold_no_machine_paths_and_no_diary():
    for name, result in _results().items():
        text = json.dumps(result, ensure_ascii=False)
        assert not DIARY.search(text), f"{name}.json: {DIARY.search(text).group(0)!r}"
    for line in ("measured 2026-12-01", "at 05:40 UTC", "this session's run", "the helper's job", "/tmp/exp/m0"):
        assert DIARY.search(line), line


def test_a_rerun_replaces_its_own_record_and_writes_the_schema(tmp_path):
    path = tmp_path / "assignment.json"
    table = record.table("seconds", ["n", "s"], [[64, 0.001]])
    record.save(path, "assignment", "n 64", "n 64", [table])
    record.save(path, "assignment", "n 128", "n 128", [table])
    record.save(path, "assignment", "n 64", "n 64 again", [table])
    result = record.load(path)
    assert record.problems(result) == []
    assert [r["title"] for r in result["records"]] == ["n 128", "n 64 again"]
    rec = result["records"][0]
    assert rec["tables"][0]["rows"] == [["64", "0.001"]] and set(rec["machine"]) >= {"cpu", "cores", "torch"}
    assert rec["commands"][0].startswith("python ") and not DIARY.search(json.dumps(result))
    assert record.save("-", "assignment", "k", "t", [table]) is None  # '-': nothing written


def test_paths_in_commands_are_portable():
    assert record.portable(str(BENCH / "assignment.py")) == "benchmarks/assignment.py"
    assert record.portable(str(ROOT.parent / "shared" / "data" / "x.txt")) == "../shared/data/x.txt"
    assert record.portable("/somewhere/else/data.txt") == "data.txt"
    assert record.portable("runs/a") == "runs/a"
    assert record.command([str(BENCH / "assignment.py"), "--sizes", "64"]) == "python benchmarks/assignment.py --sizes 64"


def test_the_benchmarks_readme_is_generated_from_the_results():
    import make_readme

    assert (BENCH / "README.md").read_text() == make_readme.render(), "run python benchmarks/make_readme.py"
    text = make_readme.render()
    assert not DIARY.search(text)
    for result in _results().values():
        assert f"## {result['title']}" in text and f"`{result['script']}`" in text
    # negative control: a figure changed in a result shows in the generated text, which then differs
    results = make_readme.load_all()
    cell = results[0]["records"][0]["tables"][0]["rows"][0]
    cell[-1] = "123.456"
    changed = make_readme.render(results)
    assert changed != text and "| 123.456 |" in changed


def test_the_readme_says_how_long_each_pair_takes_to_rebuild_at_2_threads():
    import make_readme
    import pairs
    import rebuild_times

    result = json.loads((BENCH / "results" / "pairs.json").read_text())
    rows = {r[0]: r for r in rebuild_times.rebuild_rows(result)}
    assert set(rows) == set(pairs.PAIRS)
    assert rows["gpt2-bpe-small-240"][2:] == ["18 min (1058 s)", "yes"]  # the slower seed: 1058 s against 770 s
    text = make_readme.render()
    assert "### Rebuilding a pair at 2 threads" in text and "| gpt2-bpe-small-240 | 2 | 18 min (1058 s) | yes |" in text
    # negative controls: a seed over 30 minutes is said to be over, and a pair without a time is not estimated
    slow = json.loads(json.dumps(result).replace('"1058 s"', '"1900 s"'))
    assert rebuild_times.rebuild_rows(slow)[list(pairs.PAIRS).index("gpt2-bpe-small-240")][3] == "no"
    assert "Over 30 minutes: gpt2-bpe-small-240." in " ".join(rebuild_times.section(slow))
    assert rows["neox-seq-char-demo"][2:] == ["not recorded", "not known"]


def test_records_say_plainly_what_they_do_not_know_of_the_machine():
    import make_readme

    rec = {"commit": "a" * 40, "threads": 1, "machine": {"cpu": record.NOT_RECORDED, "cores": 2, "torch": "2.13.0+cpu"}}
    assert make_readme.machine_line(rec) == ("Recorded at commit `aaaaaaaaaa` on a machine with 2 cores, torch 2.13.0+cpu, "
                                             "1 thread. The CPU model was not recorded.")
    rec["machine"]["cpu"] = "AMD EPYC"
    assert "CPU: AMD EPYC, 2 cores" in make_readme.machine_line(rec) and "not recorded" not in make_readme.machine_line(rec)


def unlisted_inputs(result: dict) -> list[str]:
    """The names of `pairs.py` whose models a record's commands read (`runs/FOLDER`) but `inputs` does not list."""
    import pairs

    listed = {i.split(" ")[0] for i in result["inputs"]}
    folders = {name: re.compile(folder.replace("{seed}", r"\d+")) for name, (folder, _, _) in pairs.PAIRS.items()}
    read = {name for rec in result["records"] for c in rec["commands"] for f in re.findall(r"runs/([\w.-]+)", c)
            for name, rx in folders.items() if rx.fullmatch(f)}
    return sorted(read - listed)


def test_every_trained_model_a_benchmark_reads_is_in_its_inputs():
    assert {name: u for name, r in _results().items() if (u := unlisted_inputs(r))} == {}
    # negative control: a command that reads a pair the inputs leave out
    result = _results()["family_barriers"]
    result["records"][0]["commands"].append("symmerge barrier runs/mnist-vit-demo-seed0 runs/mnist-vit-demo-seed1")
    assert unlisted_inputs(result) == ["vit-demo"]


def test_each_pair_names_the_data_its_benchmarks_read():
    import pairs

    assert pairs.data_of("neox-char-demo", "D") == "D/tinyshakespeare.txt"
    assert pairs.data_of("llama-wiki-char-demo", "D") == "D/wikitext2-test.txt"
    assert pairs.data_of("vit-fashion-demo", "D") == "D/fashion-mnist"
    assert pairs.is_vision("vit-fashion-demo") and pairs.is_vision("vit-demo")
    # negative controls: a language pair is not an image classifier, and pairs on other data differ
    assert not pairs.is_vision("gpt2-wiki-char-demo")
    assert pairs.data_of("gpt2-wiki-char-demo") != pairs.data_of("gpt2-char-demo")
    for name in pairs.PAIRS:  # every pair trains on data beside the checkout
        assert pairs.data_of(name, "D").startswith("D/"), name


def test_the_rotary_studys_per_family_rates_step_each_tensor_at_its_factor():
    import rotary_study
    import torch

    a, b, c = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    opt = rotary_study.faster([a, b, c], [0.0, 1.0, 3.0], lr=0.1)
    (a.sum() + b.sum() + c.sum()).backward()
    opt.step()
    # Adam's first step moves each tensor by its rate: 0, 0.1, 0.3; the scheduled rate itself is left as it was
    assert torch.allclose(a, torch.ones(2)) and torch.allclose(b, torch.full((2,), 0.9))
    assert torch.allclose(c, torch.full((2,), 0.7)) and [g["lr"] for g in opt.param_groups] == [0.1] * 3


def test_an_interrupted_dual_run_of_a_benchmark_is_resumed_not_refused(tmp_path, monkeypatch):
    import default_dual

    calls = []
    monkeypatch.setattr(default_dual.subprocess, "run", lambda argv, **kw: calls.append(argv) or kw["stdout"].write(
        f"printed by run {len(calls)}\n"))
    out, commands = tmp_path / "pair", []
    default_dual.symmerge(["align", "a", "b", "-o", str(out)], tmp_path / "pair.json", commands, learns=out)
    (tmp_path / "pair.learn-state").mkdir()  # what a run stopped between its checkpoints leaves
    default_dual.symmerge(["align", "a", "b", "-o", str(out)], tmp_path / "pair.json", commands, learns=out)
    # a fresh run does not resume (negative control); the interrupted one does, and is recorded as the fresh one
    assert "--resume" not in calls[0] and calls[1][-1] == "--resume"
    assert commands[0] == commands[1] and "--resume" not in commands[1]
    # what each run printed is kept beside its report, the resumed run's after the interrupted one's
    assert (tmp_path / "pair.log").read_text() == "printed by run 1\nprinted by run 2\n"
    (tmp_path / "pair.json").write_text("{}")
    default_dual.symmerge(["align", "a", "b", "-o", str(out)], tmp_path / "pair.json", commands, learns=out)
    assert len(calls) == 2  # a finished step is read, not run again


def test_the_default_benchmarks_label_runs_of_other_lengths_apart():
    import default_dual
    from default_dual import Variant

    assert Variant().suffix() == "" and Variant().flags() == [] and Variant().words() == ""
    assert Variant(8.0).suffix() == "-epochs8" and Variant(8.0).flags() == ["--epochs", "8"]
    assert Variant(4.0, 2.0).suffix() == "-epochs4-extend2" and Variant(4.0, 2.0).words() == " with --epochs 4 --extend 2"
    assert Variant(lam_sampling="peak").flags() == ["--lam-sampling", "peak"]
    assert Variant(lam_sampling="peak").suffix() == "-lam-samplingpeak"
    assert Variant(4.0, recompute="block").suffix() == "-epochs4-recomputeblock"
    assert Variant(recompute="block").flags() == ["--recompute", "block"]
    # the label word and the flag differ where a flag's name is not the label's
    assert Variant(start="activation").flags() == ["--start-from", "activation"]
    assert Variant(start="activation").suffix() == "-startactivation"
    assert Variant(seed=1).flags() == ["--seed", "1"] and Variant(seed=1).suffix() == "-seed1"
    assert default_dual.pair_label("p", (2, 3), Variant(seed=1)) == "p-seeds23-seed1"
    assert default_dual.pair_label("p", (0, 1), Variant(4.0, 2.0)) == "p-epochs4-extend2"
    assert default_dual.pair_label("p", (2, 3)) == "p-seeds23"


def _spans(tmp_path, lock: str) -> list[tuple[float, float]]:
    """(enter, leave) of two processes that each hold `lock` (an expression over `pairs` and the folder `f`) for 2 s."""
    import subprocess
    import sys

    code = ("import sys, time; sys.path.insert(0, {bench!r}); from pathlib import Path; import contextlib, pairs\n"
            "f = Path({folder!r})\n"
            "with {lock}:\n"
            "    print('in', time.monotonic(), flush=True); time.sleep(2.0); print('out', time.monotonic(), flush=True)\n")
    source = code.format(bench=str(BENCH), folder=str(tmp_path / "runs" / "model-seed0"), lock=lock)
    procs = [subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return sorted(tuple(float(line.split()[1]) for line in out.splitlines()) for out in outs)


def test_pairs_training_lock_lets_one_process_train_a_model(tmp_path):
    """Two processes naming one model: the second waits for the first's `training_lock`, then (in `pairs.main`) finds
    the model trained. Control: with no lock their spans overlap."""
    first, second = _spans(tmp_path, "pairs.training_lock(f)")
    assert second[0] >= first[1], f"both held the lock at once: {first}, {second}"
    first, second = _spans(tmp_path, "contextlib.nullcontext()")
    assert second[0] < first[1], f"the control did not overlap: {first}, {second}"


def test_barrier_by_token_classes_cut_at_the_shares_of_training_tokens():
    """Ids ranked by count: a class holds the tokens whose share covered before them lies below its bound."""
    import torch
    from barrier_by_token import token_classes

    counts = torch.tensor([9, 50, 1, 30, 10, 0])  # by count: ids 1, 3, 4, 0, 2, 5; covered before: 0, .5, .8, .9, .99, 1
    assert token_classes(counts).tolist() == [1, 0, 2, 0, 0, 2]
    # the control: another ranking moves the classes
    assert token_classes(torch.tensor([50, 9, 1, 30, 10, 0])).tolist() != [1, 0, 2, 0, 0, 2]
