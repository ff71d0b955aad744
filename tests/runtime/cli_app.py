"""Worker factories for the `venturi worker` command tests."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from venturi import Context, Outcome, PanicPolicy, PostgresStore, Task, Worker

logger = logging.getLogger(__name__)


@dataclass
class Echo(Task):
    KIND = "echo"
    text: str


@dataclass
class Boom(Task):
    KIND = "boom"


async def echo(task: Echo, ctx: Context[None], app: None) -> Outcome:
    return Outcome.completed(note=task.text)


def make_worker(store: PostgresStore) -> Worker[None]:
    worker = Worker(None, store, concurrency=2)
    worker.register(Echo, echo)
    return worker


async def careless_echo(task: Echo, ctx: Context[None], app: None) -> Outcome:
    # A handler that logs what it should not: the DSN, password and all.
    logger.debug("echo %s, connected with %s", task.text, os.environ["VENTURI_DSN"])
    return Outcome.completed(note=task.text)


async def boom(task: Boom, ctx: Context[None], app: None) -> Outcome:
    raise RuntimeError(f"cannot reach {os.environ['VENTURI_DSN']}")


def make_careless_worker(store: PostgresStore) -> Worker[None]:
    """Handlers that log the DSN and raise with it in the message (dead at once)."""
    worker = Worker(None, store, concurrency=2, panic_policy=PanicPolicy.DEAD)
    worker.register(Echo, careless_echo)
    worker.register(Boom, boom)
    return worker


@dataclass
class WhichLoop(Task):
    KIND = "which_loop"


async def which_loop(task: WhichLoop, ctx: Context[None], app: None) -> Outcome:
    loop = type(asyncio.get_running_loop())
    return Outcome.completed(note=f"{loop.__module__}.{loop.__qualname__}")


def make_loop_worker(store: PostgresStore) -> Worker[None]:
    """A handler that notes the class of the event loop it runs on."""
    worker = Worker(None, store, concurrency=1)
    worker.register(WhichLoop, which_loop)
    return worker


def make_metrics_worker(store: PostgresStore) -> Worker[None]:
    """Serves /metrics on the port in $METRICS_PORT."""
    worker = Worker(None, store, concurrency=1, metrics_port=int(os.environ["METRICS_PORT"]))
    worker.register(Echo, echo)
    return worker


@dataclass
class Nap(Task):
    KIND = "nap"


async def nap(task: Nap, ctx: Context[None], app: None) -> Outcome:
    await asyncio.sleep(3600)  # deaf to the cooperative cancel; an abort ends it
    return Outcome.completed()


def make_napping_worker(store: PostgresStore) -> Worker[None]:
    """A handler that winds down only when aborted, under a grace period of 10 minutes."""
    worker = Worker(None, store, concurrency=1, shutdown_timeout=600)
    worker.register(Nap, nap)
    return worker
