"""``python -m searchr1_lld.lab``."""

import sys

from searchr1_lld.lab import main

sys.exit(main())
