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
    from symmerge.model import load_model

    d = tmp_path_factory.mktemp("pair")
    return load_model(save_model(make_model("gpt2", 0), d / "a")), load_model(save_model(make_model("gpt2", 1), d / "b"))
