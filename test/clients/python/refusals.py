"""Refusals as grpcio (gRPC C-core) sees them, with no generated code: raw bytes on generic calls.

Usage: refusals.py HOST:PORT. Prints one JSON object: for each case the status code name, the
details text, and whether the grpc-status-details-bin trailer (our ErrorEnvelope) came.
"""

import json
import sys

import grpc


def call(channel: grpc.Channel, method: str, body: bytes) -> dict:
    try:
        channel.unary_unary(method)(body, timeout=10)
        return {"code": "OK"}
    except grpc.RpcError as err:
        trailers = dict(err.trailing_metadata() or [])
        return {
            "code": err.code().name,
            "details": err.details(),
            "details_bin": "grpc-status-details-bin" in trailers,
        }


def main() -> None:
    channel = grpc.insecure_channel(sys.argv[1])
    create = "/acs.v1.CompletionsService/CreateCompletion"
    report = {
        "unknown_method": call(channel, "/acs.v1.CompletionsService/Nope", b""),
        "unknown_service": call(channel, "/acs.v1.Nope/Call", b""),
        "malformed": call(channel, create, b"\x0a\xff"),
        # grpcio sends no Content-Length: the message is refused while it is read.
        "oversize": call(channel, create, b"\x12" + b"\x80\x80\x80\x05" + b"x" * (10 * 1024 * 1024)),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
