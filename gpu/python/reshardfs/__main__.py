"""`reshardfs ...` (the wheel's console script) and `python -m reshardfs ...`: the packaged program, with the
same arguments, exit status and output; this process becomes it."""

from __future__ import annotations

import os
import sys

from reshardfs._binary import binary


def main() -> None:
    try:
        program = str(binary())
    except FileNotFoundError as error:
        sys.exit(f"reshardfs: error: {error}")
    os.execv(program, [program, *sys.argv[1:]])


if __name__ == "__main__":
    main()
