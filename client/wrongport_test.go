package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/resp"
	"github.com/ringlimit/ringlimit/service"
)

// TestWrongPort: a client given a node's HTTP or RESP port instead of its
// gRPC port says so (it said "http2: frame too large"), and a client of
// a port where nothing listens is not told it is the wrong one.
func TestWrongPort(t *testing.T) {
	listen := func() net.Listener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return lis
	}
	svc := service.New(service.Config{})
	httpLis, respLis := listen(), listen()
	hs := &http.Server{Handler: api.New(api.Config{Checker: svc}).Handler()}
	go hs.Serve(httpLis)
	defer hs.Close()
	rs := resp.New(resp.Config{Checker: svc})
	go rs.Serve(respLis)
	defer rs.Shutdown(context.Background())
	closed := listen()
	closed.Close()
	for _, tc := range []struct {
		addr, want string
	}{
		{httpLis.Addr().String(), ": that is an HTTP port; the Go client wants the gRPC port (a node's --grpc-addr, default :8081)"},
		{respLis.Addr().String(), ": that is a RESP (Redis protocol) port; the Go client wants the gRPC port"},
		{closed.Addr().String(), ""},
	} {
		c, err := client.New(tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on a hang
		_, err = c.Allow(ctx, client.Limit{Name: "a", Count: 1, Period: time.Second}, "k")
		cancel()
		c.Close()
		switch {
		case tc.want == "" && errors.Is(err, client.ErrWrongPort):
			t.Errorf("%s, where nothing listens: %v, want no wrong port", tc.addr, err)
		case tc.want != "" && (!errors.Is(err, client.ErrWrongPort) || !strings.Contains(err.Error(), tc.addr+tc.want)):
			t.Errorf("%s: %v, want ErrWrongPort saying %q", tc.addr, err, tc.want)
		}
	}
}
