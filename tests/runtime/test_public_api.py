"""The public surface is explicit: everything public is exported from `venturi`."""

from __future__ import annotations

import venturi


def test_all_is_complete() -> None:
    # Its order is ruff's (RUF022: constants, then classes, then the rest, each sorted).
    public = {name for name in vars(venturi) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(venturi, name)).__name__ == "module"}
    assert set(venturi.__all__) == public - modules


def test_exported_names_resolve() -> None:
    for name in venturi.__all__:
        assert getattr(venturi, name) is not None
