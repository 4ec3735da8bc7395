package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/grpclimit"
	"github.com/ringlimit/ringlimit/service"
)

func Example() {
	// A real program asks a node: c, err := client.New("localhost:8081").
	// The example runs a one-node service in process, its clock fixed.
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := client.Wrap(service.New(service.Config{Now: func() time.Time { return now }}))

	l := &grpclimit.Limiter{Client: c, Limit: client.Limit{Name: "api", Count: 2, Period: time.Minute}}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(l.Unary), grpc.ChainStreamInterceptor(l.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for range 3 {
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		fmt.Print(st.Code())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Print(", retry in ", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted, retry in 30s
}
