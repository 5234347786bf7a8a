"""``python -m coordex``: the same command line as the ``coordex`` script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
