"""The web dashboard: see and operate a venturi queue from a browser.

    from venturi import dashboard
    app.mount("/venturi", dashboard.app(store, gate=lambda request: is_admin(request)))

`app()` returns a Starlette (ASGI) application, mountable at any path of a FastAPI, Starlette
or other ASGI app, or served alone by `venturi dashboard`. It needs the `dashboard` extra
(`pip install 'venturi[dashboard]'`); the rest of venturi never imports it.
"""

from __future__ import annotations

try:
    from venturi.dashboard._app import app
    from venturi.dashboard._guard import Gate
except ModuleNotFoundError as exc:  # Starlette, Jinja2 or uvicorn missing
    raise ImportError(
        f"venturi.dashboard needs the dashboard extra: pip install 'venturi[dashboard]' ({exc})"
    ) from exc

__all__ = ["Gate", "app"]
