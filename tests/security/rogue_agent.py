"""An agent that lies: it reports as another node, and answers stack requests it was never sent
(every request id up to 20, with a frame named EVIL_FRAME), for as long as it runs.

python rogue_agent.py ADDRESS TOKEN_FILE NODE JOB_ID   (TOKEN_FILE "-": none)
Prints "connected" once the coordinator took the call, or "refused: CODE DETAILS".
"""

from __future__ import annotations

import asyncio
import sys
import time

import grpc

from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc


def lies(node: str, job_id: str) -> list[pb.AgentMessage]:
    now = time.time()
    report = pb.AgentMessage(report=pb.NodeReport(node=node, sent_at=now, ranks=[pb.RankState(
        job_id=job_id, rank=1, local_rank=1, world_size=2, host=node, pid=4242, hooked=True,
        steps=10, events=99, last_event_at=now, exited_at=now, exit_code=0, clean_exit=True)]))
    answers = [pb.AgentMessage(stacks=pb.StackReply(request_id=n, node=node, stacks=[
        pb.RankStack(rank=rank, pid=4242, frames=[pb.Frame(function="EVIL_FRAME", file="x.py")])
        for rank in (0, 1)])) for n in range(1, 21)]
    return [report, *answers]


async def main(address: str, token_file: str, node: str, job_id: str) -> None:
    metadata = None
    if token_file != "-":
        with open(token_file) as f:
            metadata = (("authorization", f"Bearer {f.read().strip()}"),)

    async def lie_forever(call: grpc.aio.StreamStreamCall[pb.AgentMessage,
                                                           pb.CoordinatorMessage]) -> None:
        report, *answers = lies(node, job_id)
        while True:  # answers arrive all the time: one lands while a request is open
            await call.write(report)
            for message in answers:
                await call.write(message)
            await asyncio.sleep(0.005)

    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.CoordinatorStub(channel).Connect(metadata=metadata)
        writer = None
        try:
            # Nothing is written before the coordinator accepts the call (grpc/grpc#36066).
            if dict(await call.initial_metadata()).get("watchdog-accepted"):
                print("connected", flush=True)
                writer = asyncio.create_task(lie_forever(call))
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as e:
            print(f"refused: {e.code().name} {e.details()}", flush=True)
        if writer is not None:
            writer.cancel()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
