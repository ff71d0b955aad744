import sys

from venturi.cli import main

sys.exit(main())
