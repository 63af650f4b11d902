"""A socket where `watchdog status` looks for a `watchdog run` of this user, answering Status
with whatever JSON it is given: a forged job, or one missing the fields status shows.

python fake_run.py STATUS_JSON   (prints "ready PATH" once it listens)
"""

from __future__ import annotations

import asyncio
import os
import sys

import grpc

from watchdog.supervise.runs_dir import claim_run_socket
from watchdog.transport.proto import watchdog_pb2 as pb
from watchdog.transport.proto import watchdog_pb2_grpc as pb_grpc


class Forged(pb_grpc.CoordinatorServicer):
    def __init__(self, answer: str) -> None:
        self.answer = answer

    async def Status(self, request: pb.StatusRequest,
                     context: grpc.aio.ServicerContext[pb.StatusRequest, pb.StatusReply]
                     ) -> pb.StatusReply:
        return pb.StatusReply(status_json=self.answer)


async def main(answer: str) -> None:
    path = claim_run_socket(os.getpid(), env={})  # /tmp/torch-hang-watchdog-<uid>/run-<pid>.sock
    assert path is not None, "no runs directory of this user"
    server = grpc.aio.server()
    pb_grpc.add_CoordinatorServicer_to_server(Forged(answer), server)
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    os.chmod(path, 0o600)
    print("ready", path, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
