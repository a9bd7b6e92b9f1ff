"""``python -m pinguard ARGS``: the bundled ``pinguard`` command with ARGS (the ``pinguard``
console script is the same)."""

import os
import sys

from . import command_path


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    exe = command_path()
    if not os.access(exe, os.X_OK):
        sys.stderr.write("pinguard: the bundled command %s is missing or not executable; reinstall the package\n" % exe)
        return 2
    os.execv(exe, [exe] + args)


if __name__ == "__main__":
    sys.exit(main())
