"""One rule for yes/no environment variables (`symmerge.runtime.envvars.flag`), used by the progress bars
(`TQDM_DISABLE`) and by hf: data's offline check (`HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`)."""

import pytest

from symmerge.runtime.envvars import flag


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("YES", True), (" on ", True), ("anything", True),
    ("0", False), ("false", False), (" No ", False), ("OFF", False),
    ("", None), ("   ", None),
])
def test_flag_reads_every_value_by_one_rule(monkeypatch, value, expected):
    monkeypatch.setenv("SYMMERGE_TEST_FLAG", value)
    assert flag("SYMMERGE_TEST_FLAG") is expected


def test_unset_is_none(monkeypatch):
    monkeypatch.delenv("SYMMERGE_TEST_FLAG", raising=False)
    assert flag("SYMMERGE_TEST_FLAG") is None
