package nodeport_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/internal/nodeport"
	"github.com/ringlimit/ringlimit/resp"
)

func TestSniff(t *testing.T) {
	for in, want := range map[string]nodeport.Port{
		"HTTP/1.1 400 Bad Request\r\n":              nodeport.HTTP,
		"HTTP/1.0 200 OK":                           nodeport.HTTP,
		"\x00\x00\x0c\x04\x00\x00\x00\x00\x00":      nodeport.GRPC, // SETTINGS, 12 bytes
		"\x00\x00\x00\x04":                          nodeport.GRPC,
		"-ERR Protocol error: this is the RESP\r\n": nodeport.RESP,
		"+PONG\r\n":                                 nodeport.RESP,
		"":                                          nodeport.Unknown,
		"HTT":                                       nodeport.Unknown,
		"\x16\x03\x03\x00\x7a":                      nodeport.Unknown, // TLS
		"-1":                                        nodeport.Unknown,
		"\x00\x00\x08\x06":                          nodeport.Unknown, // PING, not SETTINGS
	} {
		if got := nodeport.Sniff([]byte(in)); got != want {
			t.Errorf("Sniff(%q) = %v, want %v", in, got, want)
		}
	}
}

// ports serves a node's three client ports on loopback, each by the
// server a node runs it with, and returns their addresses.
func ports(t *testing.T) map[nodeport.Port]string {
	t.Helper()
	listen := func() net.Listener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return lis
	}
	httpLis, grpcLis, respLis := listen(), listen(), listen()
	hs := &http.Server{Handler: http.NewServeMux()}
	go hs.Serve(httpLis)
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(grpcLis)
	rs := resp.New(resp.Config{})
	go rs.Serve(respLis)
	t.Cleanup(func() {
		hs.Close()
		gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rs.Shutdown(ctx)
	})
	return map[nodeport.Port]string{nodeport.HTTP: httpLis.Addr().String(), nodeport.GRPC: grpcLis.Addr().String(), nodeport.RESP: respLis.Addr().String()}
}

// TestProbe: a client of either port, probing each of a node's ports,
// finds which it is.
func TestProbe(t *testing.T) {
	addrs := ports(t)
	for _, want := range []nodeport.Port{nodeport.HTTP, nodeport.GRPC} {
		for port, addr := range addrs {
			if got := nodeport.Probe(context.Background(), addr, want, nil); got != port {
				t.Errorf("a %v client probing the %v port: found %v", want, port, got)
			}
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	if got := nodeport.Probe(context.Background(), lis.Addr().String(), nodeport.GRPC, nil); got != nodeport.Unknown {
		t.Errorf("a port that does not answer: %v, want Unknown", got)
	}
}

func TestCheck(t *testing.T) {
	addrs := ports(t)
	err := nodeport.Check(context.Background(), addrs[nodeport.GRPC], nodeport.HTTP, nil, "rlnode top")
	want := addrs[nodeport.GRPC] + ": that is a gRPC port; rlnode top wants the HTTP port (a node's --http-addr, default :8080)"
	if err == nil || err.Error() != want || !errors.Is(err, nodeport.ErrWrongPort) {
		t.Errorf("Check = %v, want %q", err, want)
	}
	if err := nodeport.Check(context.Background(), addrs[nodeport.GRPC], nodeport.GRPC, nil, ""); err != nil {
		t.Errorf("Check of the right port = %v, want nil", err)
	}
}

// FuzzSniff: any first bytes a server sends are one port or Unknown,
// never a panic, and a port is told only from what it begins with.
func FuzzSniff(f *testing.F) {
	for _, s := range []string{"HTTP/1.1 400", "\x00\x00\x0c\x04\x00", "-ERR x", "+OK", "", "\x16\x03"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := nodeport.Sniff(b)
		if got < nodeport.Unknown || got > nodeport.RESP {
			t.Fatalf("Sniff(%q) = %d", b, got)
		}
		if got != nodeport.Unknown && nodeport.Sniff(append(b[:len(b):len(b)], "more"...)) != got {
			t.Fatalf("Sniff(%q) = %v changes with more bytes", b, got)
		}
	})
}
