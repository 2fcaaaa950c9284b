"""Container health check: exit 0 when the gRPC server at HOST:PORT reports SERVING.

python /app/healthcheck.py 127.0.0.1:50052
python /app/healthcheck.py 127.0.0.1:50052 --ca ca.crt --server-name attest-lexical \\
    [--cert tls.crt --key tls.key]

With --ca it speaks TLS (the kubelet's native gRPC probe cannot), checking the
server's certificate for --server-name, and presents a client certificate when
the server requires one (mTLS). Health needs no credential.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(args: argparse.Namespace) -> grpc.Channel:
    if args.ca is None:
        return grpc.insecure_channel(args.address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(args.ca).read_bytes(),
        private_key=Path(args.key).read_bytes() if args.key else None,
        certificate_chain=Path(args.cert).read_bytes() if args.cert else None,
    )
    options = []
    if args.server_name:
        options.append(("grpc.ssl_target_name_override", args.server_name))
    return grpc.secure_channel(args.address, credentials, options=options)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT")
    parser.add_argument("--ca", help="CA bundle of the server's certificate (TLS)")
    parser.add_argument("--server-name", help="name the server's certificate must carry")
    parser.add_argument("--cert", help="client certificate (mTLS)")
    parser.add_argument("--key", help="client private key (mTLS)")
    args = parser.parse_args(argv[1:])
    if bool(args.cert) != bool(args.key):
        parser.error("--cert and --key go together")
    with _channel(args) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
        except grpc.RpcError as exc:
            print(f"{args.address}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(f"{args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
