"""``python -m verispec``: the same command line as the ``verispec`` script."""

import sys

from verispec.cli import main

sys.exit(main())
