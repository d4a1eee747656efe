#!/usr/bin/python3
"""A Python (grpcio) client of acs.v1.CompletionsService, as a user would write one.

Generated code comes from `npm run generate:clients -- DIR`; run with DIR/python on PYTHONPATH:

    PYTHONPATH=DIR/python /usr/bin/python3 test/clients/python/client.py http://127.0.0.1:8080 llama-8b

It calls ListModels, CreateCompletion and StreamCompletion, cancels a stream after two chunks,
reads the acs.v1.ErrorEnvelope of a refused request from the gRPC status details, and captures
the residual stream of every layer (a response larger than gRPC's default 4 MiB receive limit).
It prints one JSON object of what it saw (status codes as numbers); test/integration/clients-python-go.test.ts compares it
with what the gateway answers over REST.
"""

import hashlib
import json
import sys
from urllib.parse import urlparse

import grpc
from acs.v1 import completions_pb2, completions_pb2_grpc, error_pb2, lens_pb2
from google.rpc import status_pb2

# A capture holds up to 2^25 numbers (64 MiB of bf16) plus framing; gRPC's default is 4 MiB.
MAX_RECEIVE_BYTES = 80 * 1024 * 1024

CAPTURE_PROMPT = "The quick brown fox jumps over the lazy dog. " * 6


def error_envelope(err: grpc.RpcError) -> error_pb2.ErrorEnvelope | None:
    """The acs.v1.ErrorEnvelope detail of a failed call (google.rpc.Status in the trailers)."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_pb2.ErrorEnvelope.DESCRIPTOR):
                    envelope = error_pb2.ErrorEnvelope()
                    detail.Unpack(envelope)
                    return envelope
    return None


def metadata_value(metadata, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value
    return None


def main() -> None:
    url, model = sys.argv[1], sys.argv[2]
    target = urlparse(url).netloc or url  # grpcio takes host:port; the gateway speaks h2c
    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)])
    stub = completions_pb2_grpc.CompletionsServiceStub(channel)
    report: dict = {}

    models = stub.ListModels(completions_pb2.ListModelsRequest())
    report["list_models"] = [
        {
            "id": m.id,
            "aliases": list(m.aliases),
            "max_model_len": m.max_model_len,
            "hidden_size": m.hidden_size,
            "num_hidden_layers": m.num_hidden_layers,
        }
        for m in models.data
    ]

    request = completions_pb2.CreateCompletionRequest(
        model=model, text="The sky is", max_tokens=5, temperature=0, ignore_eos=True
    )
    response, call = stub.CreateCompletion.with_call(request)
    report["create"] = {
        "id": response.id,
        "model": response.model,
        "text": response.choices[0].text,
        "finish_reason": completions_pb2.FinishReason.Name(response.choices[0].finish_reason),
        "completion_tokens": response.usage.completion_tokens,
        "x_request_id": metadata_value(call.initial_metadata(), "x-request-id"),
    }

    request.stream_options.include_usage = True
    text, chunks, finishes, usage_total = "", 0, [], None
    for chunk in stub.StreamCompletion(request):
        for choice in chunk.choices:
            chunks += 1
            text += choice.text
            if choice.finish_reason != completions_pb2.FINISH_REASON_UNSPECIFIED:
                finishes.append(completions_pb2.FinishReason.Name(choice.finish_reason))
        if not chunk.choices and chunk.HasField("usage"):
            usage_total = chunk.usage.total_tokens
    report["stream"] = {"text": text, "chunks": chunks, "finish_reasons": finishes, "usage_total": usage_total}

    long = completions_pb2.CreateCompletionRequest(
        model=model, text="Once upon a time", max_tokens=1000, temperature=0, ignore_eos=True
    )
    stream = stub.StreamCompletion(long)
    read = [next(stream), next(stream)]
    stream.cancel()
    try:
        next(stream)
        code = grpc.StatusCode.OK.value[0]
    except grpc.RpcError as err:
        code = err.code().value[0]
    report["cancel"] = {"chunks_read": len(read), "code": code}

    refused = completions_pb2.CreateCompletionRequest(model=model, text="x", n=2, max_tokens=16001)
    try:
        stub.CreateCompletion(refused)
        report["error"] = {"code": grpc.StatusCode.OK.value[0]}
    except grpc.RpcError as err:
        envelope = error_envelope(err)
        report["error"] = {
            "code": err.code().value[0],
            "details": err.details(),
            "x_request_id": metadata_value(err.initial_metadata(), "x-request-id")
            or metadata_value(err.trailing_metadata(), "x-request-id"),
            "envelope": None
            if envelope is None
            else {
                "message": envelope.error.message,
                "type": envelope.error.type,
                "param": envelope.error.param if envelope.error.HasField("param") else None,
                "code": envelope.error.code if envelope.error.HasField("code") else None,
                "request_id": envelope.request_id,
            },
        }

    capture = completions_pb2.CreateCompletionRequest(
        model=model, text=CAPTURE_PROMPT, max_tokens=2, temperature=0, ignore_eos=True
    )
    capture.output_residual_stream.all_layers = True
    tensor = stub.CreateCompletion(capture).activations.residual_stream
    report["capture"] = {
        "shape": list(tensor.shape),
        "dtype": lens_pb2.Dtype.Name(tensor.dtype),
        "compression": lens_pb2.Compression.Name(tensor.compression),
        "bytes": len(tensor.data),
        "sha256": hashlib.sha256(tensor.data).hexdigest(),
    }

    channel.close()
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
