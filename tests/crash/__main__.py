"""``python -m tests.crash``: see :mod:`tests.crash.runner`."""

import sys

from tests.crash.runner import main

sys.exit(main())
