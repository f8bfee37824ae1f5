"""Checkpoints named by Hugging Face Hub id, `ORG/NAME` or `ORG/NAME@REVISION` (a branch, tag or commit),
resolved to a local snapshot folder by `huggingface_hub.snapshot_download`; and the Hub's reachability.

- Only what symmerge reads is fetched (`ALLOW`): config.json, safetensors and their index, tokenizer and
  processor files. Never pickles, never remote code. A repository with pickled weights only is refused
  with the conversion to run.
- The cache, the token and offline mode are huggingface_hub's own (HF_HOME, HF_HUB_CACHE, HF_TOKEN,
  HF_HUB_OFFLINE): nothing here overrides them. When offline mode is off but the Hub does not answer
  within `HUB_PROBE_SECONDS`, ids resolve from the cache alone, at once rather than after retries.
- A folder that exists wins over an id of the same spelling; where the cache also holds that id, a
  note on stderr says which was read.
- Every id resolved since `forget()` (the CLI calls it once per command) is recorded: `resolved()` gives
  the given spelling, repository, revision and commit of each, for reports and output metadata, and
  `name_of` the Hub id of a resolved snapshot folder.
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SymmergeError
from ..runtime.envvars import flag
from .io import INDEX, SIDE_FILES

#: the files fetched for an id: what `io.Checkpoint`, tokenizers and image processors read
ALLOW = ["config.json", "*.safetensors", INDEX, *SIDE_FILES]
#: seconds the Hub gets to answer a connection before ids (and hf:NAME data) resolve from the cache only
HUB_PROBE_SECONDS = 3.0
_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^@\s]+))?")


@dataclass(frozen=True)
class Resolved:
    """An id as given, its repository and revision (None: the default branch), the commit it resolved to,
    and the local snapshot folder holding that commit's files."""

    given: str
    repo_id: str
    revision: str | None
    commit: str
    path: str


_RESOLVED: dict[str, Resolved] = {}  # by snapshot folder


def forget() -> None:
    """Start a new record of resolved ids (once per command)."""
    _RESOLVED.clear()


def resolved() -> list[dict]:
    """Every id resolved since `forget()`, as JSON-able records (in the order they were resolved)."""
    return [asdict(r) for r in _RESOLVED.values()]


def name_of(path) -> str:
    """The Hub id (with its @revision where one was given) a folder was resolved from, else the folder's name."""
    r = _RESOLVED.get(str(path))
    if r is None:
        return Path(path).name or str(path)
    return r.repo_id if r.revision is None else f"{r.repo_id}@{r.revision}"


def parse_id(text: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) when `text` is spelled as a Hub id ORG/NAME[@REVISION], else None."""
    m = _ID.fullmatch(text)
    if m is None or len(m["repo"]) > 96 or "--" in m["repo"] or ".." in m["repo"] or m["repo"].endswith(".git"):
        return None
    return m["repo"], m["revision"]


def resolve(text) -> str:
    """A local checkpoint folder for `text`: `text` itself when it exists (or is no Hub id), else the
    snapshot of the Hub id it spells (see the module docstring; one-line `SymmergeError`s otherwise)."""
    text = str(text)
    parsed = parse_id(text)
    if Path(text).exists() or parsed is None:
        if parsed is not None and _cached(parsed[0]):
            print(f"symmerge: note: {text} is a folder here and a Hub id in the cache; reading the folder "
                  f"(pass another spelling of the path, or move the folder, to read the Hub id)", file=sys.stderr)
        return text
    repo, revision = parsed
    offline = offline_reason()
    path = Path(_download(text, repo, revision, offline))
    _check_weights(text, repo, path, offline)
    _RESOLVED[str(path)] = Resolved(text, repo, revision, path.name, str(path))
    return str(path)


def resolve_args(args) -> None:
    """Resolve, in place, the arguments a command names in `args.checkpoints` (each a string or a list)."""
    for name in getattr(args, "checkpoints", ()):
        value = getattr(args, name, None)
        if isinstance(value, list):
            setattr(args, name, [resolve(v) for v in value])
        elif value is not None:
            setattr(args, name, resolve(value))


def _cached(repo: str) -> bool:
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}").is_dir()


def _download(given: str, repo: str, revision: str | None, offline: str | None) -> str:
    """The snapshot folder of `repo` at `revision` (from the cache alone where `offline` says why), every
    huggingface_hub failure as one line."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return snapshot_download(repo, revision=revision, allow_patterns=ALLOW, local_files_only=offline is not None)
    except GatedRepoError:
        raise SymmergeError(f"{given}: {repo} is a gated repository; accept its conditions on the Hub and set HF_TOKEN "
                            "(or run `hf auth login`) with a token that has access") from None
    except RepositoryNotFoundError:
        raise SymmergeError(f"{given} is not a folder, and the Hub has no repository {repo} (or it is private: set "
                            "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise SymmergeError(f"{given}: {repo} has no revision {revision} (give a branch, tag or commit)") from None
    except LocalEntryNotFoundError:
        raise SymmergeError(_not_cached(given, repo, revision, offline, Path(constants.HF_HUB_CACHE))) from None
    except HfHubHTTPError as e:
        if e.response is not None and e.response.status_code == 401:
            raise SymmergeError(f"{given}: the Hub refused access to {repo} without valid credentials; set HF_TOKEN "
                                "(or run `hf auth login`)") from None
        raise SymmergeError(f"cannot fetch {given} from the Hub: {str(e).splitlines()[0]}") from None
    except (OSError, ValueError) as e:  # an incomplete cached snapshot, a full disk, a bad revision spelling
        raise SymmergeError(f"cannot fetch {given} from the Hub: {str(e).splitlines()[0]}") from None


def _not_cached(given: str, repo: str, revision: str | None, offline: str | None, cache: Path) -> str:
    why = offline or "the Hub could not be asked"
    storage = cache / f"models--{repo.replace('/', '--')}"
    if not storage.is_dir():
        return (f"{given} is not a folder, and the Hub id {repo} is not cached in {cache} while {why}: run once with "
                "network access to cache it, or pass a checkpoint folder")
    refs = sorted(p.name for p in (storage / "refs").glob("*") if p.is_file()) if (storage / "refs").is_dir() else []
    return (f"{given}: revision {revision or 'main'} of {repo} is not cached (cached: {', '.join(refs) or 'none'}) "
            f"while {why}; give a cached revision or run once with network access")


def _check_weights(given: str, repo: str, path: Path, offline: str | None) -> None:
    """Refuse a snapshot without safetensors weights, saying so plainly where the repository holds pickles."""
    if list(path.glob("*.safetensors")) or (path / INDEX).is_file():
        return
    pickles = list(path.glob("*.bin")) or list(path.glob("*.pt"))
    if not pickles and offline is None:
        from huggingface_hub import list_repo_files

        pickles = [f for f in list_repo_files(repo, revision=path.name) if f.endswith((".bin", ".pt", ".pth"))]
    if pickles:
        raise SymmergeError(f"{given}: {repo} holds only pickled weights (*.bin); symmerge never unpickles. Convert "
                            "once, in an environment you trust: AutoModel.from_pretrained(id).save_pretrained(folder, "
                            "safe_serialization=True), and pass the folder (or push it to the Hub)")
    raise SymmergeError(f"{given}: {repo} has no safetensors weights (model.safetensors or {INDEX})")


def offline_reason(env: tuple[str, ...] = ("HF_HUB_OFFLINE",)) -> str | None:
    """Why the Hub is not to be asked: a variable of `env` is set (offline mode), or the Hub does not
    answer within `HUB_PROBE_SECONDS`; None when it can be asked."""
    import huggingface_hub.constants as hub

    on = [v for v in env if flag(v)]
    if on:
        return f"{on[0]} is set (offline mode)"
    if not _reachable(hub.ENDPOINT, HUB_PROBE_SECONDS):
        return f"{hub.ENDPOINT} cannot be reached (no network?)"
    return None


def _reachable(url: str, timeout: float) -> bool:
    """Whether a TCP connection to `url`'s host opens within `timeout` seconds (name lookup included:
    it runs in a thread that is abandoned, not waited for, when it takes longer)."""
    import socket
    import threading
    from urllib.parse import urlparse

    u = urlparse(url)
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)
    ok = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)
