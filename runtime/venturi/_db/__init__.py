"""The SQL layer: every statement venturi runs, the migrations, and the loader for both.

Only `venturi.postgres` imports this package.
"""
