"""``python -m searchr1_lld.world build|export|smollm2 ...``: build the synthetic world (or its SmolLM2 variant),
export a built world's warm start for shipping."""

from __future__ import annotations

import sys

from searchr1_lld.cli import run_main
from searchr1_lld.world.build import main as build_main
from searchr1_lld.world.shipped import main as export_main

USAGE = """usage: python -m searchr1_lld.world {build,export,smollm2} [options]

  build     the synthetic world: corpus, index, QA splits, tokenizer, warm-started policy (--help for options)
  export    a built world's warm-started policy and its manifest, for `build --warm-start-from` (--help for options)
  smollm2   the same world's data with SmolLM2-135M-Instruct warm-started on it (--help for options)
"""


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C -> one line, exit status 130 (:func:`searchr1_lld.cli.run_main`)."""
    return run_main(_dispatch, argv, prog="python -m searchr1_lld.world")


def _dispatch(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "build":
        return build_main(rest)
    if command == "export":
        return export_main(rest)
    if command == "smollm2":
        from searchr1_lld.world.smollm2 import main as smollm2_main  # deferred: transformers

        return smollm2_main(rest)
    print(f"unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
