package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/connectivity"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/service"
)

// BenchmarkFaces measures one check request of 1 and of 100 checks over
// loopback, through each face of one Server backed by a real single-node
// service: gRPC (a real grpc.Server with ServerOptions, and a generated
// client), a CheckStream (its requests one at a time, as the Go client
// sends a batch, through a mux.Client) and HTTP/JSON (Handler behind httptest.NewServer, and an
// http.Client that keeps its connection). Requests are sent one at a
// time. allocs/op counts client and server, as both run in this process.
// The gRPC client marshals its request and unmarshals the answer, as it
// must; the HTTP client posts a body built once and reads the answer
// without parsing it, so that the figures are the server's JSON, not the
// client's.
func BenchmarkFaces(b *testing.B) {
	for _, items := range []int{1, 100} {
		req := &pb.CheckRequest{}
		for i := range items {
			req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint("user:", i), Limit: 1_000_000_000, DurationMs: 1000})
		}
		b.Run(fmt.Sprintf("items=%d/grpc", items), func(b *testing.B) {
			rl := pb.NewRateLimiterClient(serveGRPC(b, New(Config{Checker: service.New(service.Config{})}), ServerOptions()...))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rl.Check(ctx, req)
				if err != nil || len(resp.Responses) != items {
					b.Fatalf("check: %v, %v", resp, err)
				}
			}
			b.ReportMetric(float64(b.N*items)/b.Elapsed().Seconds(), "checks/s")
		})
		b.Run(fmt.Sprintf("items=%d/stream", items), func(b *testing.B) {
			conn := serveGRPC(b, New(Config{Checker: service.New(service.Config{})}), ServerOptions()...)
			rl := pb.NewRateLimiterClient(conn)
			c := mux.NewClient(mux.Config[pb.CheckStreamRequest, pb.CheckStreamResponse]{
				Open:  rl.CheckStream,
				Ready: func() bool { return conn.GetState() == connectivity.Ready },
				Stamp: func(r *pb.CheckStreamRequest, id uint64, timeoutMs int64) { r.Id, r.TimeoutMs = id, timeoutMs },
				ID:    (*pb.CheckStreamResponse).GetId,
			})
			defer c.Close()
			ctx := context.Background()
			if _, err := rl.Check(ctx, req); err != nil { // connects: a stream opens only on a connection that is up
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.Call(ctx, &pb.CheckStreamRequest{Requests: req.Requests})
				if err == nil {
					err = mux.Err(resp.GetStatus())
				}
				if err != nil || len(resp.GetResponses()) != items {
					b.Fatalf("check: %v, %v", resp, err)
				}
			}
			b.ReportMetric(float64(b.N*items)/b.Elapsed().Seconds(), "checks/s")
		})
		b.Run(fmt.Sprintf("items=%d/http", items), func(b *testing.B) {
			srv := httptest.NewServer(New(Config{Checker: service.New(service.Config{})}).Handler())
			defer srv.Close()
			body := httpBody(b, req)
			hc := srv.Client()
			var out bytes.Buffer
			b.ReportAllocs()
			for b.Loop() {
				resp, err := hc.Post(srv.URL+"/v1/check", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				out.Reset()
				_, err = out.ReadFrom(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("check: %d %s, %v", resp.StatusCode, out.Bytes(), err)
				}
			}
			b.ReportMetric(float64(b.N*items)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

// httpBody is the POST /v1/check body of req's items, as a client would
// write it (zero fields omitted).
func httpBody(tb testing.TB, req *pb.CheckRequest) []byte {
	tb.Helper()
	type item struct {
		Name       string `json:"name"`
		Key        string `json:"key"`
		Limit      int64  `json:"limit"`
		DurationMs int64  `json:"duration_ms"`
	}
	var body struct {
		Requests []item `json:"requests"`
	}
	for _, it := range req.Requests {
		body.Requests = append(body.Requests, item{it.Name, it.Key, it.Limit, it.DurationMs})
	}
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
