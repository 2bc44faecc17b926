"""``python -m hpcsched script.py`` (under mpiexec) and the ``scheduler`` / ``worker`` commands."""

import sys

from hpcsched.launchers.cli import main

if __name__ == "__main__":
    sys.exit(main())
