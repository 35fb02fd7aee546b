"""``python -m searchr1_lab.demo``."""

import sys

from searchr1_lab.demo.command import main

sys.exit(main())
