"""``python -m lonnymq.spark [DIR]``: build the zip of lonnymq that ``spark-submit --py-files``
takes (see :func:`lonnymq.spark.package_zip`) in DIR (default: a private temporary folder) and
print its path."""

from __future__ import annotations

import sys

from . import package_zip


def main(argv: list[str]) -> int:
    if len(argv) > 1 or any(a.startswith("-") for a in argv):
        print("usage: python -m lonnymq.spark [DIR]", file=sys.stderr)
        return 2
    try:
        print(package_zip(argv[0] if argv else None))
    except OSError as e:  # a folder that does not exist or may not be written: one line
        where = argv[0] if argv else "the temporary directory"
        print(f"python -m lonnymq.spark: cannot write the zip in {where}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
