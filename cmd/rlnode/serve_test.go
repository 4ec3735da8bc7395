package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/node/nodetest"
)

// startNode serves a node on loopback ports chosen by the kernel and
// returns its HTTP and gRPC addresses, and a stop function that waits for
// serve to return.
func startNode(t *testing.T, args ...string) (httpAddr, grpcAddr string, stop func() error) {
	t.Helper()
	n, stop := startNamedNode(t, t.Name(), args...)
	return n.HTTPAddr(), n.GRPCAddr(), stop
}

// startNamedNode is startNode for one of several nodes in a test, with
// the node's own flags args.
func startNamedNode(t testing.TB, name string, args ...string) (*node.Node, func() error) {
	t.Helper()
	conf, err := parseConfig(append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--peer-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--node-name", name}, args...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return nodetest.Start(t, conf.Config)
}

func TestServeAnswersAndStops(t *testing.T) {
	httpAddr, grpcAddr, stop := startNode(t)
	resp, err := http.Post("http://"+httpAddr+"/v1/check", "application/json",
		strings.NewReader(`{"requests":[{"name":"api","key":"user:42","limit":1,"duration_ms":60000}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"status":"UNDER_LIMIT"`) {
		t.Errorf("HTTP check: %s", b)
	}
	c, err := client.New(grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok, err := c.Allow(context.Background(), client.Limit{Name: "api", Count: 1, Period: time.Minute}, "user:42")
	if err != nil || ok {
		t.Errorf("gRPC check of the same counter: %v %v, want refused", ok, err)
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"check", "--addr", grpcAddr, "--key", "user:7", "--limit", "5", "--duration", "1m"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "ALLOWED  4 of 5 remaining") {
		t.Errorf("rlnode check printed %q", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"members", "--addr", httpAddr}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), t.Name()+" (self)") {
		t.Errorf("rlnode members printed %q", out.String())
	}
	if err := stop(); err != nil {
		t.Errorf("serve returned %v after shutdown, want nil", err)
	}
}
