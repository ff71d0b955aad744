"""`venturi new-task`: the files of a new task (its class, handler and registration, and a
test that runs it through venturi's pytest plugin), written without overwriting anything.

Rendering is pure (`render`); `write` only creates files, and refuses before writing any of
them if one already exists, so a run never leaves half a scaffold behind.
"""

from __future__ import annotations

import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")
_MODULE = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*")


@dataclass(frozen=True, slots=True)
class Scaffold:
    name: str
    """The task class, e.g. SendInvoice."""
    module: str
    """The dotted module the task lives in, e.g. myapp.orders."""
    kind: str
    """Its KIND, e.g. send_invoice."""
    files: dict[Path, str]
    """Relative path -> content, in the order they are written."""


def snake(name: str) -> str:
    """SendInvoice -> send_invoice, HTTPPing -> http_ping."""
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words).lower()


def check(name: str, module: str) -> None:
    """Raise a ValueError naming what is wrong with `name` or `module`."""
    if not _CLASS_NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ValueError(
            f"task name {name!r}: expected a Python class name in CamelCase "
            f"(a capital letter, then letters and digits), e.g. SendInvoice"
        )
    parts = module.split(".")
    if not _MODULE.fullmatch(module) or any(keyword.iskeyword(p) for p in parts):
        raise ValueError(
            f"module {module!r}: expected a dotted Python module path in lowercase, "
            f"e.g. myapp.orders"
        )
    if parts[0] in sys.stdlib_module_names or parts[0] in ("venturi", "tests", "test"):
        # ./os.py would shadow the standard library's for everything run from here (its
        # generated test could not import it either); tests/ holds the generated test.
        raise ValueError(
            f"module {module!r}: {parts[0]!r} is taken (the standard library, venturi or the "
            f"tests folder); put the task in your own package, e.g. myapp.{parts[-1]}"
        )


def render(name: str, module: str) -> Scaffold:
    """The files for task `name` in `module` (validated first)."""
    check(name, module)
    kind = snake(name)
    handler = kind
    parts = module.split(".")
    package_dirs = [Path(*parts[:i]) for i in range(1, len(parts))]
    files: dict[Path, str] = {}
    for d in package_dirs:
        files[d / "__init__.py"] = ""
    files[Path(*parts[:-1], f"{parts[-1]}.py")] = _TASK.format(
        name=name, kind=kind, handler=handler
    )
    files[Path("tests", f"test_{parts[-1]}_{kind}.py")] = _TEST.format(
        name=name, module=module, kind=kind
    )
    return Scaffold(name, module, kind, files)


def write(scaffold: Scaffold, root: Path) -> list[Path]:
    """Create the scaffold's files under `root`; package `__init__.py` files that exist are
    kept. Raises FileExistsError naming the file before writing anything if a module or
    test file is already there."""
    todo = {
        path: text
        for path, text in scaffold.files.items()
        if not (path.name == "__init__.py" and (root / path).exists())
    }
    for path in todo:
        if (root / path).exists():
            raise FileExistsError(
                f"{root / path} already exists: new-task never overwrites anything"
            )
    written = []
    for path, text in todo.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("x") as f:  # "x": fails rather than overwrite, even in a race
            f.write(text)
        written.append(target)
    return written


_TASK = '''\
"""The {name} task: what a job carries, what runs it, and how a worker learns it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from venturi import Context, Outcome, Task, Worker


@dataclass
class {name}(Task):
    """One {name} job. Keep the payload small and JSON-friendly: ids, not objects."""

    KIND = "{kind}"

    id: int


async def {handler}(task: {name}, ctx: Context[None], app: Any) -> Outcome:
    """Do the work. Raise to fail this run (it is retried with backoff), raise
    `TaskError.permanent(...)` to give up, or return `Outcome.pause_in(...)` to come back."""
    ctx.attach({{"id": task.id}})  # evidence on this run's journal entry
    return Outcome.completed()


def register(worker: Worker[Any]) -> None:
    """Teach `worker` this task: call it where the application builds its worker."""
    worker.register({name}, {handler})
'''

_TEST = '''\
"""{name}, run through a real worker on a real PostgreSQL by venturi's pytest plugin
(`pip install venturi[testing]`; set VENTURI_TEST_DSN, or let it start a private server)."""

from __future__ import annotations

import pytest

from venturi import JobStatus, PostgresStore, Queue, Worker
from venturi.testing import Jobs, WorkerFactory
from {module} import {name}, register


def build_worker(store: PostgresStore) -> Worker[None]:
    worker: Worker[None] = Worker(None, store, concurrency=1)
    register(worker)
    return worker


@pytest.fixture
def venturi_worker() -> WorkerFactory:
    return build_worker


@pytest.mark.asyncio
async def test_{kind}_completes(venturi_queue: Queue, venturi_jobs: Jobs) -> None:
    job_id = await venturi_queue.enqueue({name}(id=1))
    await venturi_jobs.assert_enqueued({name}, where=lambda task: task.id == 1, count=1)

    assert await venturi_jobs.run_jobs() == 1

    job = await venturi_queue.job(job_id)
    assert job is not None
    assert job.status is JobStatus.COMPLETED
'''
