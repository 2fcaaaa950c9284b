"""Container health check: exit 0 when the gRPC server at HOST:PORT reports SERVING.

python /app/healthcheck.py 127.0.0.1:50052
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: healthcheck.py HOST:PORT", file=sys.stderr)
        return 2
    with grpc.insecure_channel(argv[1]) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
        except grpc.RpcError as exc:
            print(f"{argv[1]}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(f"{argv[1]}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
