package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/admit"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/node"
)

// TestClientPortBoundsDescriptors checks that the client port decodes at
// most 1,001 descriptors of an Envoy rate limit request (api.ServerOptions
// with rls's bound), however many are sent, and refuses one whose
// descriptors hold more than api.MaxMessages entries.
func TestClientPortBoundsDescriptors(t *testing.T) {
	_, grpcAddr, _ := startNode(t)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlspb.RateLimitRequest{Domain: "d", Descriptors: make([]*commonpb.RateLimitDescriptor, 100_000)}
	for i := range req.Descriptors {
		req.Descriptors[i] = &commonpb.RateLimitDescriptor{}
	}
	_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptors: 1001, at most 1000") {
		t.Errorf("100,000 descriptors: %v, want InvalidArgument counting 1001 of them", err)
	}
	one := &commonpb.RateLimitDescriptor{Entries: make([]*commonpb.RateLimitDescriptor_Entry, 100_000)}
	for i := range one.Entries {
		one.Entries[i] = &commonpb.RateLimitDescriptor_Entry{}
	}
	req = &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*commonpb.RateLimitDescriptor{one}}
	_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "more than 65536 messages") {
		t.Errorf("a descriptor of 100,000 entries: %v, want it refused for its messages", err)
	}
}

func TestParseConfigBounds(t *testing.T) {
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxInflight != admit.DefaultMax || c.MaxStreams != admit.DefaultMaxStreams || c.MaxConns != node.DefaultMaxConns || c.MaxLogEntries != limiter.DefaultMaxLogEntries ||
		c.MaxConnsPerSource != node.DefaultMaxConnsPerSource || c.HandshakeTimeout != node.DefaultHandshakeTimeout || c.IdleTimeout != node.DefaultIdleTimeout ||
		c.StreamSendTimeout != node.DefaultStreamSendTimeout || c.StreamIdleTimeout != node.DefaultStreamIdleTimeout || c.RequestTimeout != node.DefaultRequestTimeout ||
		c.MaxReservations != limiter.DefaultMaxReservations || c.MaxReservationsPerKey != limiter.DefaultMaxReservationsPerKey {
		t.Errorf("defaults: %+v", c)
	}
	for _, args := range [][]string{
		{"--max-inflight", "0"},
		{"--max-streams", "0"},
		{"--max-conns", "-1"},
		{"--max-conns-per-source", "-1"},
		{"--handshake-timeout", "0s"},
		{"--idle-timeout", "-1s"},
		{"--stream-send-timeout", "0s"},
		{"--stream-idle-timeout", "0s"},
		{"--request-timeout", "0s"},
		{"--max-log-entries", "9999"},
		{"--max-reservations", "0"},
		{"--max-reservations-per-key", "0"},
		{"--max-reservations", "10", "--max-reservations-per-key", "11"},
	} {
		if _, err := parseConfig(args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: err %v, want one naming %s", args, err, args[0])
		}
	}
}

// TestMaxConns opens --max-conns idle connections to the HTTP port: a
// further one is closed as soon as it is accepted (counted), and once one
// of them closes a new client is served. Before, the third waited in the
// kernel's backlog, unanswered.
func TestMaxConns(t *testing.T) {
	httpAddr, _, _ := startNode(t, "--max-conns", "2")
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	third, err := net.Dial("tcp", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	allClosedByServer(t, []net.Conn{third})
	idle[0].Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	eventually(t, "a client served once a connection closed", func() bool {
		resp, err := client.Get("http://" + httpAddr + "/healthz")
		if err != nil {
			return false // refused while the server had not yet seen the close
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	idle[1].Close()
	eventually(t, "the refusal counted", metricAtLeast(httpAddr, `ringlimit_connections_refused_total{listener="http",reason="total"}`, 1))
}

func TestMemoryLimit(t *testing.T) {
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(path string) ([]byte, error) {
			if s, ok := m[path]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	const v2, v1 = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	cases := []struct {
		name   string
		flag   string
		env    map[string]string
		files  map[string]string
		want   int64
		source string
	}{
		{"flag", "512MiB", nil, map[string]string{v2: "1000\n"}, 512 << 20, "--memory-limit"},
		{"flag in bytes beats GOMEMLIMIT", "1000000", map[string]string{"GOMEMLIMIT": "1GiB"}, nil, 1_000_000, "--memory-limit"},
		{"GOMEMLIMIT is the runtime's", "", map[string]string{"GOMEMLIMIT": "1GiB"}, map[string]string{v2: "1000\n"}, 0, "GOMEMLIMIT"},
		{"cgroup v2", "", nil, map[string]string{v2: "1073741824\n", v1: "5"}, 1073741824 / 10 * 9, v2},
		{"cgroup v2 unlimited", "", nil, map[string]string{v2: "max\n"}, 0, v2},
		{"cgroup v1", "", nil, map[string]string{v1: "2147483648\n"}, 2147483648 / 10 * 9, v1},
		{"cgroup v1 unlimited", "", nil, map[string]string{v1: "9223372036854771712\n"}, 0, v1},
		{"no cgroup", "", nil, nil, 0, "none"},
	}
	for _, c := range cases {
		got, source, err := memoryLimit(c.flag, env(c.env), files(c.files))
		if err != nil || got != c.want || source != c.source {
			t.Errorf("%s: %d from %q, %v; want %d from %q", c.name, got, source, err, c.want, c.source)
		}
	}
	for _, bad := range []string{"lots", "-1MiB", "0", "1.5GiB", "1GB", "99999999TiB"} {
		if _, err := parseConfig([]string{"--memory-limit", bad}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
			t.Errorf("--memory-limit %s: err %v, want one naming the flag", bad, err)
		}
	}
	if _, _, err := memoryLimit("", env(nil), files(map[string]string{v2: "garbage"})); err == nil || !strings.Contains(err.Error(), v2) {
		t.Errorf("a garbled cgroup file: err %v, want one naming it", err)
	}
}

// TestDuplicateNodeName starts a second node under the name of a live one:
// it never reports ready and serve fails with ErrNameTaken (rlnode exits
// 2, saying why), while the first node stays ready.
func TestDuplicateNodeName(t *testing.T) {
	first, _ := startNamedNode(t, "dup")
	second, stop := startNamedNode(t, "dup", "--join", first.Cluster().GossipAddr())
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + second.HTTPAddr() + "/readyz")
		if err != nil {
			break // serve has stopped
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("the second node reports ready")
		}
		if time.Now().After(deadline) {
			t.Fatal("the second node still serves after 15s")
		}
	}
	err := stop()
	if !errors.Is(err, cluster.ErrNameTaken) || exitCode(err, io.Discard) != 2 {
		t.Errorf("serve of the second node = %v, want ErrNameTaken and exit status 2", err)
	}
	resp, err := http.Get("http://" + first.HTTPAddr() + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the first node: %v %v, want ready", resp, err)
	}
	resp.Body.Close()
}
