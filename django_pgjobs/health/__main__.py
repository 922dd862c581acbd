"""``python -m django_pgjobs.health PATH [--max-age S]``: exit 0 while PATH is fresh."""

import sys

from django_pgjobs.health.health_file import main

sys.exit(main())
