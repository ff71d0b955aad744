"""``python -m bench.adapters SYSTEM {control|worker} ...``: start one system's adapter.

The adapter module is imported rather than run as ``__main__``, so that libraries that care
where their objects are defined (procrastinate warns about apps defined in ``__main__``) see
an ordinary module.
"""

import importlib
import sys

from bench.adapters.base import serve

system = sys.argv.pop(1)
module = importlib.import_module(f"bench.adapters.{system}_adapter")
serve(module.SYSTEM)
