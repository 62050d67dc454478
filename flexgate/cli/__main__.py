"""`python -m flexgate.cli`."""

import sys

from flexgate.cli import main

sys.exit(main())
