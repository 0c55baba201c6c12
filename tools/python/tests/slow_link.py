"""A TCP proxy on 127.0.0.1 whose bytes towards the server share a fixed rate, as an uplink
does: `python3 slow_link.py LISTEN_PORT SERVER_PORT BYTES_PER_SECOND`. Run as its own process
(a copy in the test's process holds the GIL while it waits for the network)."""

from __future__ import annotations

import asyncio
import sys
import time


class Uplink:
    """A token bucket every connection's upload draws from."""

    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.at = rate, 0.0, time.monotonic()

    async def send(self, n: int) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.rate * 0.1, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= n:
                self.tokens -= n
                return
            await asyncio.sleep((n - self.tokens) / self.rate)


async def pipe(reader, writer, uplink: Uplink | None) -> None:
    try:
        while data := await reader.read(16384):
            if uplink is not None:
                await uplink.send(len(data))
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def main(listen: int, server: int, rate: float) -> None:
    uplink = Uplink(rate)

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", server)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w, uplink), pipe(server_r, client_w, None))

    proxy = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with proxy:
        await proxy.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
