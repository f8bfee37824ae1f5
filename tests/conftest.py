import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from factories import ARCHS, make_model  # noqa: E402

#: where the project's shared data lives (../shared beside the checkout)
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_data(name: str, *also: str) -> Path:
    """`SHARED_DATA / name`, the one way tests reach the shared data. When it, or one of the files `also`
    read beside it, is absent, the calling test (or fixture) is skipped with a reason naming the missing
    file and where it is expected."""
    for n in (name, *also):
        if not (SHARED_DATA / n).exists():
            pytest.skip(f"needs the shared data file {n}: {SHARED_DATA / n} does not exist "
                        "(the data is expected in ../shared/data beside the checkout)")
    return SHARED_DATA / name


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """One saved float64 tiny checkpoint per test architecture (built once per session)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for arch in ARCHS:
        path = root / arch
        make_model(arch).save_pretrained(path)
        out[arch] = path
    return out


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a whole module of tiny matrix ops, where thread hand-offs cost more than the
    arithmetic; the previous count is restored when the module ends. A module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two tiny GPT-2s of different seeds, in memory, for the learned- and dual-matching tests (one pair per module)."""
    from factories import save_model
    from symmerge.store.model import load_model

    d = tmp_path_factory.mktemp("pair")
    return load_model(save_model(make_model("gpt2", 0), d / "a")), load_model(save_model(make_model("gpt2", 1), d / "b"))


@pytest.fixture(scope="session")
def dist_pair(tmp_path_factory):
    """The multi-process tests' tiny GPT-2 pair, trained on a text file beside it from two seeds, with a
    tokenizer (`dist_common.make_pair`): `align`'s learned steps lower its barrier."""
    from dist_common import make_pair

    return make_pair(tmp_path_factory.mktemp("dist-pair"))


def _one_process(pair, d, *extra):
    from dist_common import align
    from symmerge.cli import main

    assert main(align(*pair, d / "out", "--json", str(d / "out.json"), *extra)) == 0
    return d


@pytest.fixture(scope="session")
def one_process(dist_pair, tmp_path_factory):
    """`dist_common.align` (dual) of the pair in this one process: FOLDER/out and its report FOLDER/out.json,
    what the multi-process runs must equal."""
    return _one_process(dist_pair, tmp_path_factory.mktemp("one-process"))


@pytest.fixture(scope="session")
def half_rows(dist_pair, tmp_path_factory):
    """The same command on half of each batch (what the first of two processes would take without the
    all-reduce), in this one process: the multi-process tests' negative control."""
    return _one_process(dist_pair, tmp_path_factory.mktemp("half-rows"), "--batch-size", "2")


def pytest_configure(config):
    """Under pytest-xdist each worker takes one of the machine's cores: one torch thread per worker, so that
    two workers do not share two cores among four threads."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
