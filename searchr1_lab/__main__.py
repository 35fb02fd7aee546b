"""``python -m searchr1_lab``."""

import sys

from searchr1_lab import main

sys.exit(main())
