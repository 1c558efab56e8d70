import sys

from dlrover.cli import main

sys.exit(main())
