package admit

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// BenchmarkGRPCGate is one unary check over loopback to a server that
// answers at once: /tap admits it with Tap alone (a call at CallBytes for
// its life, as before issue 33), /real with Tap and ServerOptions (at its
// message's real size once it has arrived), within a byte budget.
func BenchmarkGRPCGate(b *testing.B) {
	for _, real := range []bool{false, true} {
		name := "tap"
		if real {
			name = "real"
		}
		b.Run(name, func(b *testing.B) {
			g := New(Config{Max: 1024, MaxBytes: 1 << 30, CallBytes: ArrivalBytes(2 << 20)})
			opts := []grpc.ServerOption{grpc.InTapHandle(g.Tap)}
			if real {
				opts = append(opts, g.ServerOptions()...)
			}
			rl := serveAnswerer(b, opts...)
			req := &pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "api", Key: "user:1", Limit: 10, DurationMs: 1000}}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rl.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
