import sys

from jsfl.cli import main

sys.exit(main())
