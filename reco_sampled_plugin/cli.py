"""The ``reco-sampled`` command line."""

from __future__ import annotations

import argparse
import sys

from . import __version__

__all__ = ["main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from .toy import format_table, toy_table

    print(format_table(toy_table(args.n_samples, args.sampling), args.n_samples))
    print(
        "\nOn the exact metrics C is best for AP, NDCG and Recall@10; on the sampled metrics it is not: "
        "sampling reverses the ordering (Krichene & Rendle, KDD 2020)."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reco-sampled",
        description="Exact, sampled and corrected ranking metrics for recommenders.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="exact vs sampled metrics on the paper's toy example (Table 1 and 2)")
    demo.add_argument("--n-samples", "-m", type=int, default=99, help="sampled irrelevant items per relevant item (default 99)")
    demo.add_argument("--sampling", choices=["binomial", "hypergeometric"], default="binomial",
                      help="with replacement (binomial, default) or without (hypergeometric)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"reco-sampled: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
