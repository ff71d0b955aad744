"""The SQL layer: every statement venturi runs, the migrations, and the loader for both.

Only `venturi.postgres` imports this package, and the dashboard (`venturi.dashboard._store`),
which runs its own statements (`queries/dashboard.sql`) on the store's pool.
"""
