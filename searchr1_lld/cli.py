"""What the command-line entry points (train.py, eval.py) share: early checks of user input and one-line errors.

    sys.exit(run_main(main, argv))     # main(argv) -> int; errors the user can fix -> one line on stderr, exit 2

Errors the user can fix (a bad config, a path that does not exist, a malformed data file, a model that is neither a
local dir nor reachable on the hub, a retriever that is down, a file system problem) are printed as one line naming
what and where; any other exception is a bug and keeps its traceback. ``--debug`` (or SEARCHR1_LLD_DEBUG=1) shows
the traceback always. Ctrl-C is one line too (``prog: interrupted``, exit status 130).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from huggingface_hub.errors import HFValidationError

from retriever.client import RetrieverError
from retriever.faiss_index import FaissSetupError
from searchr1_lld.config import ConfigError
from searchr1_lld.data.specs import EvalError
from searchr1_lld.data.jsonl import DataFileError


class UserError(Exception):
    """A problem with what the user asked for; the message says what and how to fix it."""


def looks_like_local_path(name: str) -> bool:
    """True when ``name`` can only mean a local path (a hub id is ``name`` or ``org/name``): it starts with ``/``,
    ``.`` or ``~``, has more than one ``/``, or its first component exists here."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name:
        return True
    return "/" in name and Path(name.split("/")[0]).exists()


def check_model_source(name: str, what: str, *, tokenizer: bool = False) -> None:
    """Fail early (before any world build or index load) when ``name`` is meant as a local model (or, with
    ``tokenizer``, tokenizer) dir but is not one. ``what`` is the flag or config key that gave it (named in the
    message)."""
    if not name or not looks_like_local_path(name):
        return  # empty (the caller's default applies) or a hub id (checked by from_pretrained)
    path = Path(name).expanduser()
    kind = "tokenizer" if tokenizer else "model"
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        near = f" ({parent} exists)" if parent is not None and str(parent) not in (".", "/") else ""
        raise UserError(f"{what}: {name} does not exist{near}; pass a {kind} directory (e.g. "
                        f"RUN/checkpoints/step_N/policy) or a hub id like Qwen/Qwen2.5-3B")
    markers = ("tokenizer.json", "tokenizer_config.json") if tokenizer else ("config.json",)
    if not path.is_dir() or not any((path / m).is_file() for m in markers):
        hint = f"; did you mean {path / 'policy'}?" if (path / "policy" / "config.json").is_file() else ""
        raise UserError(f"{what}: {name} is not a {kind} directory (no {' or '.join(markers)}){hint}")


def _friendly(exc: BaseException) -> str | None:
    """The one-line message of an error the user can fix, or None for a bug."""
    kinds = (UserError, ConfigError, OSError, EvalError, DataFileError, RetrieverError, FaissSetupError,
             HFValidationError)
    if not isinstance(exc, kinds):
        return None
    text = " ".join(str(exc).split())
    if isinstance(exc, (UserError, ConfigError, EvalError, DataFileError)):
        return text
    return f"{type(exc).__name__}: {text}"


def debug_requested(argv: Sequence[str] | None) -> bool:
    args = sys.argv[1:] if argv is None else argv
    return "--debug" in args or os.environ.get("SEARCHR1_LLD_DEBUG", "") not in ("", "0")


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "") -> int:
    """Run ``main(argv)``; user errors -> ``prog: error: ...`` (one line, exit 2) unless --debug; bugs re-raise."""
    prog = prog or Path(sys.argv[0]).name
    try:
        return main(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        message = _friendly(e)
        if message is None or debug_requested(argv):
            raise
        print(f"{prog}: error: {message} (--debug shows the traceback)", file=sys.stderr)
        return 2
