import sys

from sidco.cli import main

sys.exit(main())
