package peer

import (
	"context"
	"testing"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// trivial answers every request with an empty response.
type trivial struct{ *fakeHandler }

func (trivial) Forwarded(_ context.Context, reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	for i := range out {
		out[i] = &pb.CheckResponse{Responses: []*pb.CheckResult{{Remaining: 1}}}
	}
	return out
}

// BenchmarkForward forwards one-item checks over loopback from 32
// goroutines per CPU, batched and not.
func BenchmarkForward(b *testing.B) {
	addr := serve(b, trivial{&fakeHandler{}})
	p, _ := startPool(b, Config{})
	modes := []struct {
		name    string
		forward func(context.Context, string, *pb.CheckRequest) (*pb.CheckResponse, error)
	}{
		{"batched", p.Forward},
		{"unbatched", p.ForwardNow},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			req := check("bench", 1)
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := m.forward(ctx, addr, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
