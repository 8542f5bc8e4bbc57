"""Writes the GPU check's synthetic model (runtime/models/_synthetic.py: `make
bench-peers` makes the same ones, as ``--model synth:NAME``).

    python installers/gpu/synth_gguf.py OUT.gguf [--geometry llama-8b|llama-1b|tiny]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from warmstart.runtime.models._synthetic import CHAT_TEMPLATE, GEOMETRIES, Geometry, write

__all__ = ["CHAT_TEMPLATE", "GEOMETRIES", "Geometry", "main", "write"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="llama-8b")
    args = parser.parse_args(argv)
    write(args.out, GEOMETRIES[args.geometry])
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
