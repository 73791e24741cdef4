"""``python -m bench``: the same as ``turnstile bench``."""

import sys

from bench.harness import main

sys.exit(main())
