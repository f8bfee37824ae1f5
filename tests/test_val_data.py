"""`--val-data`: the batches that choose the best state come from another data set (all of it) instead of the
validation split of `--data`, for `align` and `merge` alike; a missing file is one line, nothing written."""

from __future__ import annotations

import json

from learned_common import char_pair
from symmerge import cli
from symmerge.data.batches import load_batches


def test_val_data_replaces_the_validation_split(tmp_path, capsys):
    common, _, text = char_pair(tmp_path, 8000)
    other = tmp_path / "other.txt"
    other.write_text(text[:3000][::-1])  # the same characters, another text
    js = tmp_path / "r.json"
    assert cli.main(["align", *common, "--method", "dual", "--steps", "4", "-o", str(tmp_path / "a"), "--json", str(js),
                     "--val-data", str(other)]) == 0
    given = json.loads(js.read_text())["plan"]["val_batches_given"]
    assert given == len(load_batches(common[0], str(other), "all", 32))
    # negative control: without it the validation split of --data is used, a different number of batches
    assert given != len(load_batches(common[0], common[-1], "validation", 32))

    ends = {}
    for name, extra in (("m", ["--val-data", str(other)]), ("plain", [])):
        rep = tmp_path / f"{name}.json"
        assert cli.main(["merge", *common[:2], "--method", "dual", "--steps", "2", "--data", common[-1], "-o",
                         str(tmp_path / name), "--json", str(rep), *extra]) == 0
        ends[name] = json.loads(rep.read_text())["validation_endpoint_losses"]
    assert ends["m"] != ends["plain"]  # the endpoints' validation losses are measured on the other text

    capsys.readouterr()
    assert cli.main(["align", *common, "--method", "dual", "--steps", "4", "-o", str(tmp_path / "no"),
                     "--val-data", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.txt" in err[0] and not (tmp_path / "no").exists()
