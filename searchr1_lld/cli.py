"""What the command-line entry points (train.py, eval.py) share: one declaration of a command's options, early checks
of user input and one-line errors.

    @dataclass
    class Options:                     # the typed options ARE the parser's declaration
        out: str = option(help="output dir", required=True)
    args = parse_options(Options, argv, description)   # -> Options, from the parser generated from its fields
    sys.exit(run_main(main, argv))     # main(argv) -> int; errors the user can fix -> one line on stderr, exit 2

Errors the user can fix (a bad config, a path that does not exist, a malformed data file, a model that is neither a
local dir nor reachable on the hub, a retriever that is down, a file system problem) are printed as one line naming
what and where; any other exception is a bug and keeps its traceback. ``--debug`` (or SEARCHR1_LLD_DEBUG=1) shows
the traceback always. Ctrl-C is one line too (``prog: interrupted``, exit status 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from huggingface_hub.errors import HFValidationError

from retriever.client import RetrieverError
from retriever.faiss_index import FaissSetupError
from searchr1_lld.config import ConfigError
from searchr1_lld.data.specs import EvalError
from searchr1_lld.data.jsonl import DataFileError


class UserError(Exception):
    """A problem with what the user asked for; the message says what and how to fix it."""


T = TypeVar("T")
_MISSING = dataclasses.MISSING


def option(default: Any = None, *, help: str, env: str | None = None, positional: bool = False,
           **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a command-line option: ``--field-name`` (or a positional ``field_name``) with
    ``help`` and any of argparse's ``add_argument`` keywords (``action``, ``type``, ``nargs``, ``choices``,
    ``metavar``, ``required``); ``env``: the default is that environment variable's value when set, read when the
    parser is built. A list default is copied per instance."""
    meta = {"help": help, "env": env, "positional": positional, "argparse": argparse_kwargs}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    if argparse_kwargs.get("required"):
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def options_parser(cls: type, description: str | None) -> argparse.ArgumentParser:
    """The argparse parser of the options dataclass ``cls``: one argument per field, in field order, declared by
    :func:`option` (its flag from the field's name, its default the field's)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "help" not in meta:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it with option(...)")
        kwargs = dict(meta["argparse"], help=meta["help"])
        default = f.default_factory() if f.default_factory is not _MISSING else f.default
        if meta["env"]:
            default = os.environ.get(meta["env"]) or default
        if default is not _MISSING:
            kwargs["default"] = default
        if meta["positional"]:
            parser.add_argument(f.name, **kwargs)
        else:
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    return parser


def parse_options(cls: type[T], argv: Sequence[str] | None, description: str | None) -> T:
    """``cls`` from the command line ``argv`` (:func:`options_parser`)."""
    return cls(**vars(options_parser(cls, description).parse_args(argv)))


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


# Set by Ctrl-C under run_main. Python drops a KeyboardInterrupt raised while it runs a callback of its own (an import
# lock's, a finaliser's: "Exception ignored in ..."), so long work also asks at its safe points (raise_if_interrupted).
INTERRUPTED = threading.Event()


def _on_interrupt(signum: int, frame: Any) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """KeyboardInterrupt when Ctrl-C came (under :func:`run_main`) and its first KeyboardInterrupt was lost."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "") -> int:
    """Run ``main(argv)``; user errors -> ``prog: error: ...`` (one line, exit 2) unless --debug; bugs re-raise;
    Ctrl-C -> ``prog: interrupted`` (exit 130), also recorded in :data:`INTERRUPTED` while ``main`` runs."""
    prog = prog or Path(sys.argv[0]).name
    ours = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if ours:
        INTERRUPTED.clear()
        signal.signal(signal.SIGINT, _on_interrupt)
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
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
