"""A stand-in HTTP endpoint for the load generator's own tests (never the product): it
answers every POST with 200 ``{"received": n}`` and, with ``--stall-at SEQ``, blocks its
whole event loop for ``--stall-seconds`` when the request whose first record has
``metadata.bench_req == SEQ`` arrives, like a server paused by a long GC or a stuck
write; with ``--idle-close S`` it closes a connection idle for S seconds. It writes ``{"port"}`` then ``{"stall_start", "stall_end"}`` (``time.monotonic()``,
system-wide on Linux) as JSON lines to ``--out``."""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--stall-at", type=int, default=-1)
    p.add_argument("--stall-seconds", type=float, default=0.0)
    p.add_argument("--idle-close", type=float, default=None, help="close idle connections")
    args = p.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), args.idle_close)
                except TimeoutError:
                    return  # like uvicorn's keep-alive timeout
                if not line:
                    return
                length = 0
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b""):
                        break
                    name, _, value = h.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                data = json.loads(await reader.readexactly(length)) if length else {}
                logs = data.get("logs", [])
                if logs and logs[0]["metadata"]["bench_req"] == args.stall_at:
                    start = time.monotonic()
                    time.sleep(args.stall_seconds)  # blocks the loop: nothing is answered
                    out.write(
                        json.dumps({"stall_start": start, "stall_end": time.monotonic()}) + "\n"
                    )
                answer = json.dumps({"received": len(logs), "timestamp": "now"}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        out.write(json.dumps({"port": server.sockets[0].getsockname()[1]}) + "\n")
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
