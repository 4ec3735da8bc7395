package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/syncbuf"
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

// TestServeLoopbackOnly starts a node as a bare `rlnode` would (no
// address, no security), but for its ports, which the kernel chooses
// here (the defaults may be taken on a shared machine): every port
// listens on 127.0.0.1 only, gossip advertises 127.0.0.1, no other
// address of the host reaches it, and one log line says so and how to
// listen wider.
func TestServeLoopbackOnly(t *testing.T) {
	conf, err := parseConfig([]string{"--node-name", "bare"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*string{&conf.HTTPAddr, &conf.GRPCAddr, &conf.PeerAddr, &conf.GossipAddr} {
		host, _, err := net.SplitHostPort(*a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q (%v), want one on 127.0.0.1", *a, err)
		}
		*a = net.JoinHostPort(host, "0")
	}
	var logs syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	nodes, done := make(chan *node.Node, 1), make(chan error, 1)
	go func() {
		done <- serve(ctx, conf, slog.New(slog.NewTextHandler(&logs, nil)), func(n *node.Node) { nodes <- n })
	}()
	var n *node.Node
	select {
	case n = <-nodes:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v after shutdown, want nil", err)
		}
	}()
	var self cluster.MemberInfo
	for deadline := time.Now().Add(10 * time.Second); self.GossipAddr == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("gossip did not start within 10s")
		}
		if ms := n.Cluster().Members(); len(ms) == 1 {
			self = ms[0]
		}
	}
	for what, addr := range map[string]string{"http": n.HTTPAddr(), "grpc": n.GRPCAddr(), "peer": n.PeerAddr(), "gossip": n.Cluster().GossipAddr(),
		"gossiped gossip": self.GossipAddr, "gossiped peer": self.PeerAddr, "gossiped grpc": self.GRPCAddr} {
		if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
			t.Errorf("%s address %s, want 127.0.0.1", what, addr)
		}
	}
	if ip := nonLoopbackIP(); ip != "" {
		_, port, _ := net.SplitHostPort(n.HTTPAddr())
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second); err == nil {
			c.Close()
			t.Errorf("the HTTP port answers at %s, another address of this host", ip)
		}
	}
	if got := strings.Count(logs.String(), "listening on loopback only"); got != 1 {
		t.Errorf("%d log lines say the node listens on loopback only, want 1:\n%s", got, logs.String())
	}
	for _, want := range []string{"--http-addr :8080", "--gossip-key", "loopback=\"--http-addr=127.0.0.1:8080 --grpc-addr=127.0.0.1:8081"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// nonLoopbackIP returns an IPv4 address of this host other than
// loopback, or "" if it has none.
func nonLoopbackIP() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}
