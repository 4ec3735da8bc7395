package admit

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(opts...)
			pb.RegisterRateLimiterServer(srv, answerer{})
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			rl := pb.NewRateLimiterClient(conn)
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
