"""A TCP proxy in front of PostgreSQL that can lose one reply (the connection dies after the
server committed a statement and before its reply reaches the client) or hold it back (the
reply arrives late, as through a network that stalled).

Armed with a trigger (bytes the client sends, e.g. the worker's identity, which only its
claims and settlements carry as a parameter), it forwards everything until a client message
holding the trigger has passed; from then on it holds back the server's bytes on that
connection, and once they include ReadyForQuery (sent after the implicit transaction
committed, at Sync) it closes both sides without forwarding them.
"""

from __future__ import annotations

import asyncio
import contextlib

READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class LossyProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._trigger: bytes | None = None
        self._hold: float | None = None
        self.fired = asyncio.Event()
        self.port = 0
        """The port it listens on, once started."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        self.port = port
        return port

    def arm(self, trigger: bytes, *, hold: float | None = None) -> None:
        """Lose the reply to the next client message holding `trigger`, or, with `hold`,
        deliver it `hold` seconds late."""
        self._trigger = trigger
        self._hold = hold

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._upstream)
        self._writers |= {client_w, server_w}
        triggered = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()
                if self._trigger is not None and self._trigger in data:
                    self._trigger = None  # once
                    triggered.set()

        async def downstream() -> None:
            held = b""
            while data := await server_r.read(65536):
                if triggered.is_set():
                    held += data
                    if READY_FOR_QUERY not in held:
                        continue
                    self.fired.set()
                    if self._hold is None:
                        for w in (client_w, server_w):
                            w.transport.abort()
                        return
                    await asyncio.sleep(self._hold)  # the stall itself
                    triggered.clear()
                    data, held = held, b""
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (client_w, server_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._tasks.difference_update(tasks)
