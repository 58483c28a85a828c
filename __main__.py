import sys

from .core.cli import main

sys.exit(main())
