"""``python -m django_pgjobs.health PATH [--max-age S]``: exit 0 while PATH is fresh."""

import sys

from django_pgjobs.health.probe import main

sys.exit(main())
