"""A coordinator that floods the agent connecting to it with stack requests for one job (each
would pause that job's ranks), then prints what came back as one JSON line:
{"answers": N, "dumped": stacks actually taken, "refused": ..., "seconds": the flood's length}.

python flooding_coordinator.py JOB_ID N   (prints "listening on ADDRESS" first)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator

import grpc

from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc


class Flood(pb_grpc.CoordinatorServicer):
    def __init__(self, job_id: str, count: int, done: asyncio.Event) -> None:
        self.job_id, self.count, self.done = job_id, count, done

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],
                      context: grpc.aio.ServicerContext[pb.AgentMessage, pb.CoordinatorMessage]
                      ) -> AsyncIterator[pb.CoordinatorMessage]:
        await context.send_initial_metadata((("watchdog-accepted", "1"),))  # as ours does
        async for message in request_iterator:
            if message.HasField("report") and any(
                    r.job_id == self.job_id for r in message.report.ranks):
                break
        started = time.monotonic()
        for n in range(self.count):
            yield pb.CoordinatorMessage(stack_request=pb.StackRequest(
                request_id=n + 1, job_id=self.job_id, ranks=[0]))
        dumped = refused = answers = 0
        async for message in request_iterator:
            if not message.HasField("stacks"):
                continue
            answers += 1
            (stack,) = message.stacks.stacks
            dumped += bool(stack.frames)
            refused += "at most once every" in stack.error
            if answers == self.count:
                break
        print(json.dumps({"answers": answers, "dumped": dumped, "refused": refused,
                          "seconds": time.monotonic() - started}), flush=True)
        self.done.set()


async def main(job_id: str, count: int) -> None:
    done = asyncio.Event()
    server = grpc.aio.server()
    pb_grpc.add_CoordinatorServicer_to_server(Flood(job_id, count, done), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await done.wait()
    await server.stop(1.0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
