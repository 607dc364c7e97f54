"""`python -m polar_mq.cli ...` is the `polar-mq` command."""

import sys

from polar_mq.cli import main

sys.exit(main())
