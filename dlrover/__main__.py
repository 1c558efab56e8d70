import sys

from dlrover.cli.main import main

sys.exit(main())
