"""``python -m cubepool.disco``: run one worker of a ``ProcessSession`` (one MPI rank)."""

import sys

from cubepool.disco.worker import main

sys.exit(main())
