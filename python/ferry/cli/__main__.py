"""`python3 -m ferry.cli`: the `ferry` command."""

import sys

from . import main

sys.exit(main())
