// A Go (grpc-go) client of acs.v1.CompletionsService, as a user would write one.
//
// Generated code comes from `npm run generate:clients -- DIR` (Go package prefix
// acs-gateway/gen/go, the default). In GOPATH mode with Debian's Go packages:
//
//	GOPATH=DIR/go:/usr/share/gocode GO111MODULE=off go run test/clients/go/main.go http://127.0.0.1:8080 llama-8b
//
// It calls ListModels, CreateCompletion and StreamCompletion, cancels a stream after two chunks,
// reads the acs.v1.ErrorEnvelope of a refused request from the gRPC status details, and captures
// the residual stream of every layer (a response larger than gRPC's default 4 MiB receive limit).
// It prints one JSON object of what it saw (status codes as numbers); test/integration/clients-python-go.test.ts compares it
// with what the gateway answers over REST.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	acsv1 "acs-gateway/gen/go/acs/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A capture holds up to 2^25 numbers (64 MiB of bf16) plus framing; gRPC's default is 4 MiB.
const maxReceiveBytes = 80 << 20

var capturePrompt = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 6)

// errorEnvelope returns the acs.v1.ErrorEnvelope detail of a failed call, or nil.
func errorEnvelope(err error) *acsv1.ErrorEnvelope {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, detail := range st.Details() {
		if envelope, ok := detail.(*acsv1.ErrorEnvelope); ok {
			return envelope
		}
	}
	return nil
}

func first(md metadata.MD, name string) string {
	if values := md.Get(name); len(values) > 0 {
		return values[0]
	}
	return ""
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func main() {
	target := os.Args[1]
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		target = u.Host // grpc-go takes host:port; the gateway speaks h2c
	}
	model := os.Args[2]
	conn, err := grpc.Dial(target,
		grpc.WithInsecure(), // grpc-go ≥ 1.34: grpc.WithTransportCredentials(insecure.NewCredentials())
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReceiveBytes)))
	must(err)
	defer conn.Close()
	client := acsv1.NewCompletionsServiceClient(conn)
	ctx := context.Background()
	report := map[string]interface{}{}

	models, err := client.ListModels(ctx, &acsv1.ListModelsRequest{})
	must(err)
	var list []map[string]interface{}
	for _, m := range models.GetData() {
		list = append(list, map[string]interface{}{
			"id":                m.GetId(),
			"aliases":           m.GetAliases(),
			"max_model_len":     m.GetMaxModelLen(),
			"hidden_size":       m.GetHiddenSize(),
			"num_hidden_layers": m.GetNumHiddenLayers(),
		})
	}
	report["list_models"] = list

	request := &acsv1.CreateCompletionRequest{
		Model:       model,
		Prompt:      &acsv1.CreateCompletionRequest_Text{Text: "The sky is"},
		MaxTokens:   proto.Int32(5),
		Temperature: proto.Float64(0),
		IgnoreEos:   proto.Bool(true),
	}
	var header metadata.MD
	response, err := client.CreateCompletion(ctx, request, grpc.Header(&header))
	must(err)
	report["create"] = map[string]interface{}{
		"id":                response.GetId(),
		"model":             response.GetModel(),
		"text":              response.GetChoices()[0].GetText(),
		"finish_reason":     response.GetChoices()[0].GetFinishReason().String(),
		"completion_tokens": response.GetUsage().GetCompletionTokens(),
		"x_request_id":      first(header, "x-request-id"),
	}

	request.StreamOptions = &acsv1.StreamOptions{IncludeUsage: proto.Bool(true)}
	stream, err := client.StreamCompletion(ctx, request)
	must(err)
	text, chunks, finishes := "", 0, []string{}
	var usageTotal interface{}
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			break
		}
		must(err)
		for _, choice := range chunk.GetChoices() {
			chunks++
			text += choice.GetText()
			if choice.GetFinishReason() != acsv1.FinishReason_FINISH_REASON_UNSPECIFIED {
				finishes = append(finishes, choice.GetFinishReason().String())
			}
		}
		if len(chunk.GetChoices()) == 0 && chunk.GetUsage() != nil {
			usageTotal = chunk.GetUsage().GetTotalTokens()
		}
	}
	report["stream"] = map[string]interface{}{
		"text": text, "chunks": chunks, "finish_reasons": finishes, "usage_total": usageTotal,
	}

	long := &acsv1.CreateCompletionRequest{
		Model:       model,
		Prompt:      &acsv1.CreateCompletionRequest_Text{Text: "Once upon a time"},
		MaxTokens:   proto.Int32(1000),
		Temperature: proto.Float64(0),
		IgnoreEos:   proto.Bool(true),
	}
	cancelCtx, cancel := context.WithCancel(ctx)
	longStream, err := client.StreamCompletion(cancelCtx, long)
	must(err)
	read := 0
	for ; read < 2; read++ {
		_, err := longStream.Recv()
		must(err)
	}
	cancel()
	var code codes.Code
	for {
		if _, err := longStream.Recv(); err != nil {
			code = status.Code(err)
			break
		}
	}
	report["cancel"] = map[string]interface{}{"chunks_read": read, "code": code}

	refused := &acsv1.CreateCompletionRequest{
		Model:     model,
		Prompt:    &acsv1.CreateCompletionRequest_Text{Text: "x"},
		N:         proto.Int32(2),
		MaxTokens: proto.Int32(16001),
	}
	var errHeader, errTrailer metadata.MD
	_, err = client.CreateCompletion(ctx, refused, grpc.Header(&errHeader), grpc.Trailer(&errTrailer))
	if err == nil {
		report["error"] = map[string]interface{}{"code": codes.OK}
	} else {
		st := status.Convert(err)
		requestID := first(errHeader, "x-request-id")
		if requestID == "" {
			requestID = first(errTrailer, "x-request-id")
		}
		var env interface{}
		if envelope := errorEnvelope(err); envelope != nil {
			e := envelope.GetError()
			env = map[string]interface{}{
				"message":    e.GetMessage(),
				"type":       e.GetType(),
				"param":      e.Param, // nil = unset
				"code":       e.Code,
				"request_id": envelope.GetRequestId(),
			}
		}
		report["error"] = map[string]interface{}{
			"code":         st.Code(),
			"details":      st.Message(),
			"x_request_id": requestID,
			"envelope":     env,
		}
	}

	capture := &acsv1.CreateCompletionRequest{
		Model:                model,
		Prompt:               &acsv1.CreateCompletionRequest_Text{Text: capturePrompt},
		MaxTokens:            proto.Int32(2),
		Temperature:          proto.Float64(0),
		IgnoreEos:            proto.Bool(true),
		OutputResidualStream: &acsv1.OutputResidualStream{AllLayers: true},
	}
	captured, err := client.CreateCompletion(ctx, capture)
	must(err)
	tensor := captured.GetActivations().GetResidualStream()
	sum := sha256.Sum256(tensor.GetData())
	report["capture"] = map[string]interface{}{
		"shape":       tensor.GetShape(),
		"dtype":       tensor.GetDtype().String(),
		"compression": tensor.GetCompression().String(),
		"bytes":       len(tensor.GetData()),
		"sha256":      hex.EncodeToString(sum[:]),
	}

	must(json.NewEncoder(os.Stdout).Encode(report))
}
