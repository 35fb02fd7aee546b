"""Fetch Search-R1's wiki-18 files from the Hugging Face hub: ``python -m retriever download wiki18 --out DIR``.

* the corpus ``wiki-18.jsonl.gz`` (dataset repo ``PeterJinGo/wiki-18-corpus``), always;
* with ``--index e5``, the prebuilt e5 Flat index (dataset repo ``PeterJinGo/wiki-18-e5-index``), published as two
  parts ``part_aa`` + ``part_ab`` whose byte concatenation is ``e5_Flat.index``.

Downloads go through ``huggingface_hub.hf_hub_download`` into DIR (resumable: an interrupted download continues,
a file already there is not fetched again; the hub client shows a progress bar). The parts are joined by appending
``part_ab`` to ``part_aa`` and renaming it ``e5_Flat.index``; both parts are then gone (``part_ab`` deleted, so the
join needs the index's size plus ``part_ab``'s on disk, not twice the index). Free space is checked first against the
approximate sizes below. Offline (``HF_HUB_OFFLINE=1``) or without network: one line, exit 2.

Then adopt them as an index dir:
``python -m retriever import --faiss-index DIR/e5_Flat.index --corpus DIR/wiki-18.jsonl.gz --encoder
intfloat/e5-base-v2 --out indexes/e5-wiki18``.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from tqdm import tqdm

CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
CORPUS_FILE = "wiki-18.jsonl.gz"
INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
INDEX_PARTS = ("part_aa", "part_ab")
INDEX_FILE = "e5_Flat.index"

# The Flat index holds one 768-d float32 vector per passage of the corpus: 64.6 GB (docs quote this figure).
WIKI18_PASSAGES = 21_015_324
FLAT_INDEX_BYTES = WIKI18_PASSAGES * 768 * 4
# Approximate sizes, used only for the free-space check (not verified against the hub); the compressed corpus is
# rounded up generously.
APPROX_BYTES = {CORPUS_FILE: 5_000_000_000, INDEX_FILE: FLAT_INDEX_BYTES}
APPROX_PART_AB_BYTES = APPROX_BYTES[INDEX_FILE] // 2  # extra room while part_ab is appended to part_aa (upper bound)


class DownloadError(RuntimeError):
    """A download cannot start or finish (offline, no network, not enough disk); the message says which."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def bytes_needed(out_dir: Path, with_index: bool) -> int:
    """Approximate free bytes still needed in ``out_dir`` for the files not already there."""
    need = 0
    if not (out_dir / CORPUS_FILE).is_file():
        need += APPROX_BYTES[CORPUS_FILE]
    if with_index and not (out_dir / INDEX_FILE).is_file():
        have = sum((out_dir / p).stat().st_size for p in INDEX_PARTS if (out_dir / p).is_file())
        need += max(0, APPROX_BYTES[INDEX_FILE] - have) + APPROX_PART_AB_BYTES
    return need


def check_disk(out_dir: Path, need: int) -> None:
    free = shutil.disk_usage(out_dir).free
    if free < need:
        raise DownloadError(f"not enough disk space in {out_dir}: about {_gb(need)} needed (approximate), "
                            f"{_gb(free)} free")


def fetch(repo_id: str, filename: str, out_dir: Path) -> Path:
    """One file of a hub dataset repo into ``out_dir`` (resumable), with a one-line error offline."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its per-retry warnings would bury the one-line error without network
    try:
        return Path(hf_hub_download(repo_id, filename, repo_type="dataset", local_dir=out_dir))
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as e:
        reason = "HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") \
            else f"the hub is not reachable ({type(e).__name__})"
        raise DownloadError(f"cannot download {filename} from hub dataset {repo_id}: {reason}; run with network "
                            f"access (and HF_HUB_OFFLINE unset) or put the file in {out_dir} yourself") from None
    except (HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DownloadError(f"cannot download {filename} from hub dataset {repo_id}: {first}") from None
    finally:
        hub_log.setLevel(level)


def join_parts(parts: list[Path], target: Path, *, show_progress: bool = True) -> Path:
    """Append parts[1:] to parts[0] (deleting each once appended), then rename parts[0] to ``target``.

    Interrupted, it can be rerun only by downloading again (part_aa is then longer than the hub's): the appended
    bytes are written first and the part deleted after, so no byte is lost, but part_aa is no longer pristine.
    """
    head = parts[0]
    total = sum(p.stat().st_size for p in parts[1:])
    with open(head, "ab") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"join {target.name}",
                                       disable=not show_progress) as bar:
        for part in parts[1:]:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    out.write(chunk)
                    bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
            part.unlink()
    os.replace(head, target)
    return target


def download_wiki18(out_dir: str | Path, *, index: str | None = None, show_progress: bool = True) -> dict[str, Path]:
    """Fetch the wiki-18 corpus (and with ``index="e5"`` the e5 Flat index) into ``out_dir``; returns their paths."""
    if index not in (None, "e5"):
        raise DownloadError(f"unknown prebuilt index {index!r}; available: e5")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_disk(out_dir, bytes_needed(out_dir, index == "e5"))
    got = {"corpus": fetch(CORPUS_REPO, CORPUS_FILE, out_dir)}
    if index == "e5":
        target = out_dir / INDEX_FILE
        if not target.is_file():
            parts = [fetch(INDEX_REPO, name, out_dir) for name in INDEX_PARTS]
            join_parts(parts, target, show_progress=show_progress)
        got["index"] = target
    return got
