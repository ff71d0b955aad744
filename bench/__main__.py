"""``python -m bench``: the single command that runs the whole suite."""

from bench.run import main

raise SystemExit(main())
