"""`venturi new-task`: what it writes type-checks under mypy --strict and passes the test it
wrote (against the real PostgreSQL); it never overwrites; bad names are one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import venturi
from venturi import scaffold

RUNTIME = Path(venturi.__file__).resolve().parent.parent


def new_task(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "venturi", "new-task", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [("SendInvoice", "send_invoice"), ("HTTPPing", "http_ping"), ("Sync2Db", "sync2_db")],
)
def test_the_kind_is_the_name_in_snake_case(name: str, kind: str) -> None:
    assert scaffold.render(name, "app.tasks").kind == kind


@pytest.mark.parametrize(
    ("name", "module", "wrong"),
    [
        ("send_invoice", "app", "task name 'send_invoice'"),
        ("Send-Invoice", "app", "task name 'Send-Invoice'"),
        ("None", "app", "task name 'None'"),
        ("Send", "My.App", "module 'My.App'"),
        ("Send", "app..x", "module 'app..x'"),
        ("Send", "app.class", "module 'app.class'"),
        ("Send", "os", "module 'os': 'os' is taken (the standard library"),
        ("Send", "json.tasks", "'json' is taken"),
        ("Send", "tests", "'tests' is taken"),
    ],
)
def test_a_bad_name_is_refused_with_what_is_wrong(
    tmp_path: Path, name: str, module: str, wrong: str
) -> None:
    result = new_task(tmp_path, name, "--module", module)
    assert result.returncode == 2
    assert wrong in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_it_never_overwrites_and_writes_nothing_when_it_refuses(tmp_path: Path) -> None:
    test_file = tmp_path / "tests" / "test_orders_send_invoice.py"
    test_file.parent.mkdir()
    test_file.write_text("# mine\n")
    result = new_task(tmp_path, "SendInvoice", "--module", "shop.orders")
    assert result.returncode == 2
    assert "test_orders_send_invoice.py already exists" in result.stderr
    assert test_file.read_text() == "# mine\n"
    assert not (tmp_path / "shop").exists()


def test_an_existing_package_is_kept(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("VERSION = 1\n")
    assert new_task(tmp_path, "SendInvoice", "--module", "shop.orders").returncode == 0
    assert (tmp_path / "shop" / "__init__.py").read_text() == "VERSION = 1\n"
    assert new_task(tmp_path, "Refund", "--module", "shop.refunds").returncode == 0
    assert (tmp_path / "shop" / "refunds.py").exists()


def test_what_it_writes_passes_mypy_strict_and_its_own_test(tmp_path: Path, pg_dsn: str) -> None:
    result = new_task(tmp_path, "SendInvoice", "--module", "myapp.billing.orders")
    assert result.returncode == 0, result.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py"))
    assert written == [
        "myapp/__init__.py",
        "myapp/billing/__init__.py",
        "myapp/billing/orders.py",
        "tests/test_orders_send_invoice.py",
    ]
    env = {**os.environ, "MYPYPATH": str(RUNTIME), "VENTURI_TEST_DSN": pg_dsn}
    typed = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy"),
         "myapp", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert typed.returncode == 0, typed.stdout + typed.stderr
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout
