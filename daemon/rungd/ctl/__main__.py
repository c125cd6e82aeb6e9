"""``python -m rungd.ctl``: the same as the ``rungctl`` script."""

import sys

from rungd.ctl import main

sys.exit(main())
