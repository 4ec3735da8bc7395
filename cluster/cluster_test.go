package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/ringlimit/ringlimit/ring"
)

func TestMain(m *testing.M) {
	// memberlist.Shutdown returns before its goroutines have exited (STYLE,
	// "Facts about our dependencies"); they exit within moments, and goleak
	// retries for a while before it reports, so no ignores are needed.
	goleak.VerifyTestMain(m)
}

// testNode is a Cluster running in the test process on 127.0.0.1.
type testNode struct {
	*Cluster
	reg     *prometheus.Registry
	changes atomic.Int64
	stop    func() // cancels Run and waits for it; safe to call twice
}

// start runs a node called name that joins through join. It gossips on
// bind, which is "127.0.0.1:0" when empty.
func start(t *testing.T, name, bind string, join ...string) *testNode {
	t.Helper()
	return startKeyed(t, name, bind, nil, join...)
}

// startKeyed is start for a node that encrypts gossip with keys.
func startKeyed(t *testing.T, name, bind string, keys [][]byte, join ...string) *testNode {
	t.Helper()
	return startWith(t, name, bind, func(c *Config) { c.Keys = keys }, join...)
}

// startWith is start for a node whose Config set changes.
func startWith(t *testing.T, name, bind string, set func(*Config), join ...string) *testNode {
	t.Helper()
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	n := &testNode{reg: prometheus.NewRegistry()}
	conf := Config{
		NodeName:     name,
		BindAddr:     bind,
		Join:         join,
		PeerAddr:     ":" + portFor(name, 8082),
		GRPCAddr:     ":" + portFor(name, 8081),
		HTTPAddr:     ":" + portFor(name, 8080),
		JoinRetry:    20 * time.Millisecond,
		JoinRetryMax: 200 * time.Millisecond,
		LeaveTimeout: 2 * time.Second,
		Memberlist:   memberlist.DefaultLocalConfig(),
		OnChange:     func(old, new *ring.Ring) { n.changes.Add(1) },
		Logger:       slog.New(slog.DiscardHandler),
		Registerer:   n.reg,
	}
	set(&conf)
	c, err := New(conf)
	if err != nil {
		t.Fatal(err)
	}
	n.Cluster = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s: Run = %v, want context.Canceled", name, err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("%s: Run did not return after cancel", name)
			}
		})
	}
	t.Cleanup(n.stop)
	waitFor(t, func() bool { return c.GossipAddr() != "" }, "%s: gossip started", name)
	return n
}

// portFor gives each test node name its own made-up port, so that metadata
// round trips can be checked per node.
func portFor(name string, base int) string {
	h := 0
	for _, r := range name {
		h = h*31 + int(r)
	}
	return fmt.Sprint(base + h%1000)
}

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: "+format, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ringNames(r *ring.Ring) []string {
	var names []string
	for _, m := range r.Members() {
		names = append(names, m.Name)
	}
	return names
}

func hasMembers(c *Cluster, names ...string) func() bool {
	return func() bool { return slices.Equal(ringNames(c.Ring()), names) }
}

// metric returns the value of the metric name in reg: the first sample, or
// the one with the label given as `name="value"`.
func metric(t *testing.T, reg *prometheus.Registry, name string, label ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if len(label) > 0 {
			i := slices.IndexFunc(mf.GetMetric(), func(s *dto.Metric) bool {
				return slices.ContainsFunc(s.GetLabel(), func(l *dto.LabelPair) bool {
					return fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()) == label[0]
				})
			})
			if i < 0 {
				t.Fatalf("no sample of %s with %s", name, label[0])
			}
			m = mf.GetMetric()[i]
		}
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestAlone(t *testing.T) {
	c, err := New(Config{NodeName: "solo", BindAddr: "127.0.0.1:0", PeerAddr: ":8082", GRPCAddr: ":8081",
		Memberlist: memberlist.DefaultLocalConfig(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	// Before Run: a ring of this node as configured, not ready, with its
	// process's boot id.
	boot := c.LocalMember().Boot
	if len(boot) != 16 {
		t.Errorf("boot id %q, want 16 hex digits", boot)
	}
	if got, want := c.Ring().Members(), []ring.Member{{Name: "solo", PeerAddr: ":8082", GRPCAddr: ":8081", Boot: boot}}; !slices.Equal(got, want) {
		t.Errorf("Ring before Run = %v, want %v", got, want)
	}
	if c.Ready() || c.GossipAddr() != "" {
		t.Errorf("before Run: Ready = %v, GossipAddr = %q; want false, empty", c.Ready(), c.GossipAddr())
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, c.Ready, "ready")
	want := ring.Member{Name: "solo", PeerAddr: "127.0.0.1:8082", GRPCAddr: "127.0.0.1:8081", Boot: boot}
	if got := c.LocalMember(); got != want {
		t.Errorf("LocalMember = %v, want %v", got, want)
	}
	waitFor(t, func() bool { return slices.Equal(c.Ring().Members(), []ring.Member{want}) }, "ring of %v", want)
	if m, ok := c.Ring().Owner("k"); !ok || m != want {
		t.Errorf("Owner = %v, %v; want %v", m, ok, want)
	}
	if !strings.HasPrefix(c.GossipAddr(), "127.0.0.1:") || strings.HasSuffix(c.GossipAddr(), ":0") {
		t.Errorf("GossipAddr = %q, want 127.0.0.1 and a real port", c.GossipAddr())
	}
	if err := c.Run(ctx); err == nil {
		t.Error("second Run succeeded")
	}

	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if c.Ready() {
		t.Error("Ready after Run returned")
	}
	if n := c.Ring().Len(); n != 0 {
		t.Errorf("Ring after leaving has %d members, want 0", n)
	}
}

func TestThreeNodes(t *testing.T) {
	a := start(t, "a", "")
	b := start(t, "b", "", a.GossipAddr())
	c := start(t, "c", "", a.GossipAddr())
	nodes := []*testNode{a, b, c}
	for _, n := range nodes {
		waitFor(t, hasMembers(n.Cluster, "a", "b", "c"), "%s sees a, b, c; has %v", n.LocalMember().Name, ringNames(n.Ring()))
		waitFor(t, n.Ready, "%s ready", n.LocalMember().Name)
	}

	t.Run("same owners", func(t *testing.T) {
		for i := range 10000 {
			k := fmt.Sprintf("account:%d", i)
			want, _ := a.Ring().Owner(k)
			for _, n := range nodes[1:] {
				if got, _ := n.Ring().Owner(k); got != want {
					t.Fatalf("%s: Owner(%q) = %v, a says %v", n.LocalMember().Name, k, got, want)
				}
			}
		}
	})

	t.Run("metadata", func(t *testing.T) {
		for _, n := range nodes {
			name := n.LocalMember().Name
			want := ring.Member{Name: name, PeerAddr: "127.0.0.1:" + portFor(name, 8082), GRPCAddr: "127.0.0.1:" + portFor(name, 8081),
				Boot: n.LocalMember().Boot} // gossiped to the others (see ring.Member.Boot)
			if got := n.LocalMember(); got != want || got.Boot == "" {
				t.Errorf("LocalMember = %v, want %v", got, want)
			}
			for _, other := range nodes {
				if i := slices.Index(other.Ring().Members(), want); i < 0 {
					t.Errorf("%s's ring lacks %v: %v", other.LocalMember().Name, want, other.Ring().Members())
				}
			}
		}
	})

	t.Run("members", func(t *testing.T) {
		infos := b.Members()
		if len(infos) != 3 {
			t.Fatalf("Members = %v, want 3", infos)
		}
		sum := 0.0
		for i, info := range infos {
			n := nodes[i]
			if info.Name != n.LocalMember().Name || info.State != Alive ||
				info.GossipAddr != n.GossipAddr() || info.PeerAddr != n.LocalMember().PeerAddr ||
				info.GRPCAddr != n.LocalMember().GRPCAddr || info.HTTPAddr != "127.0.0.1:"+portFor(info.Name, 8080) {
				t.Errorf("Members()[%d] = %+v, want alive %s at %s", i, info, n.LocalMember(), n.GossipAddr())
			}
			sum += info.Share
		}
		if sum < 0.999 || sum > 1.001 {
			t.Errorf("shares sum to %v, want 1", sum)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		if got := metric(t, a.reg, "ringlimit_cluster_members"); got != 3 {
			t.Errorf("members gauge = %v, want 3", got)
		}
		// a: own address filled in, then b, then c; each at least once.
		if got := metric(t, a.reg, "ringlimit_ring_rebuilds_total"); got < 3 {
			t.Errorf("rebuilds = %v, want >= 3", got)
		}
		if got, calls := metric(t, a.reg, "ringlimit_ring_rebuilds_total"), a.changes.Load(); got != float64(calls) {
			t.Errorf("rebuilds = %v but OnChange called %d times", got, calls)
		}
		if got := metric(t, a.reg, "ringlimit_cluster_join_attempts_total"); got != 0 {
			t.Errorf("a (no join) made %v join attempts", got)
		}
		if got := metric(t, b.reg, "ringlimit_cluster_join_attempts_total"); got < 1 {
			t.Errorf("b made %v join attempts, want >= 1", got)
		}
		// b joined by a push/pull stream it opened; every node probes.
		if got := metric(t, b.reg, "ringlimit_gossip_bytes_total", `transport="tcp"`); got <= 0 {
			t.Errorf("b: %v bytes of gossip streams after joining, want > 0", got)
		}
		waitFor(t, func() bool {
			return metric(t, a.reg, "ringlimit_gossip_bytes_total", `transport="udp"`) > 0
		}, "a sends gossip datagrams")
	})

	t.Run("leave", func(t *testing.T) {
		c.stop()
		for _, n := range nodes[:2] {
			waitFor(t, hasMembers(n.Cluster, "a", "b"), "%s drops c; has %v", n.LocalMember().Name, ringNames(n.Ring()))
		}
		if got := ringNames(c.Ring()); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("c's last ring = %v, want [a b]", got)
		}
		i := slices.IndexFunc(a.Members(), func(m MemberInfo) bool { return m.Name == "c" })
		if i < 0 || a.Members()[i].State != Dead || a.Members()[i].Share != 0 {
			t.Errorf("a's Members = %+v, want c dead with no share", a.Members())
		}
	})
}

// freePort returns a port that was free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestJoinBeforeSeedStarts(t *testing.T) {
	seedAddr := freePort(t)
	_, port, _ := net.SplitHostPort(seedAddr)
	b := start(t, "b", "", "localhost:"+port) // a name, resolved on each attempt
	waitFor(t, func() bool { return metric(t, b.reg, "ringlimit_cluster_join_attempts_total") >= 3 }, "3 join attempts")
	if b.Ready() {
		t.Fatal("b is ready before it could join")
	}
	if got := ringNames(b.Ring()); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("b's ring = %v, want [b]", got)
	}

	a := start(t, "a", seedAddr)
	waitFor(t, b.Ready, "b ready")
	waitFor(t, hasMembers(b.Cluster, "a", "b"), "b sees a")
	waitFor(t, hasMembers(a.Cluster, "a", "b"), "a sees b")
}

// TestJoinSelf is the first pod of a StatefulSet: its --join names a
// headless Service whose only address so far is its own. Told it starts
// the cluster (Bootstrap), it is ready, and it keeps looking for others.
// (Without Bootstrap it waits: TestJoiningOnlySelfIsNotReady.)
func TestJoinSelf(t *testing.T) {
	addr := freePort(t)
	a := startWith(t, "a", addr, func(c *Config) { c.Bootstrap = true }, addr)
	waitFor(t, a.Ready, "a ready")
	waitFor(t, func() bool { return metric(t, a.reg, "ringlimit_cluster_join_attempts_total") >= 2 }, "a keeps trying")
	start(t, "b", "", addr)
	waitFor(t, hasMembers(a.Cluster, "a", "b"), "a sees b")
}

func TestRejoinWhenAlone(t *testing.T) {
	seedAddr := freePort(t)
	a := start(t, "a", seedAddr)
	b := start(t, "b", "", seedAddr)
	waitFor(t, hasMembers(b.Cluster, "a", "b"), "b sees a")
	attempts := metric(t, b.reg, "ringlimit_cluster_join_attempts_total")

	a.stop()
	waitFor(t, hasMembers(b.Cluster, "b"), "b alone")
	waitFor(t, func() bool { return metric(t, b.reg, "ringlimit_cluster_join_attempts_total") > attempts+1 },
		"b retries to join")
	if !b.Ready() {
		t.Error("b stopped being ready when it became alone")
	}

	a2 := start(t, "a2", seedAddr) // a new node where the seed was
	waitFor(t, hasMembers(b.Cluster, "a2", "b"), "b sees a2")
	waitFor(t, hasMembers(a2.Cluster, "a2", "b"), "a2 sees b")
}

func TestNewErrors(t *testing.T) {
	long := strings.Repeat("x", 500) + ":1"
	for _, tc := range []struct {
		name string
		conf Config
	}{
		{"no name", Config{PeerAddr: ":8082"}},
		{"no peer addr", Config{NodeName: "a"}},
		{"bind without port", Config{NodeName: "a", PeerAddr: ":8082", BindAddr: "127.0.0.1"}},
		{"bind bad port", Config{NodeName: "a", PeerAddr: ":8082", BindAddr: "127.0.0.1:x"}},
		{"advertise empty host", Config{NodeName: "a", PeerAddr: ":8082", AdvertiseAddr: ":7946"}},
		{"metadata too long", Config{NodeName: "a", PeerAddr: long}},
		{"gossip key of 10 bytes", Config{NodeName: "a", PeerAddr: ":8082", Keys: [][]byte{make([]byte, 16), make([]byte, 10)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.conf); err == nil {
				t.Errorf("New(%+v) succeeded", tc.conf)
			}
		})
	}
}

func TestNewMetricsConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	conf := Config{NodeName: "a", PeerAddr: ":8082", Registerer: reg}
	if _, err := New(conf); err != nil {
		t.Fatal(err)
	}
	if _, err := New(conf); err == nil {
		t.Error("second New on the same registry succeeded")
	}
}

func TestSplitAdvertise(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
	}{
		{"10.0.0.1", "10.0.0.1", 0},
		{"10.0.0.1:7000", "10.0.0.1", 7000},
		{"rlnode-0.rlnode", "rlnode-0.rlnode", 0},
		{"rlnode-0.rlnode:7946", "rlnode-0.rlnode", 7946},
		{"fe80::1", "fe80::1", 0},
		{"[fe80::1]:7946", "fe80::1", 7946},
	} {
		host, port, err := splitAdvertise(tc.in)
		if err != nil || host != tc.host || port != tc.port {
			t.Errorf("splitAdvertise(%q) = %q, %d, %v; want %q, %d", tc.in, host, port, err, tc.host, tc.port)
		}
	}
}

func TestWithHost(t *testing.T) {
	for _, tc := range []struct{ addr, ip, want string }{
		{":8082", "10.0.0.1", "10.0.0.1:8082"},
		{"0.0.0.0:8082", "10.0.0.1", "10.0.0.1:8082"},
		{"[::]:8082", "10.0.0.1", "10.0.0.1:8082"},
		{":8082", "fe80::1", "[fe80::1]:8082"},
		{"10.0.0.2:8082", "10.0.0.1", "10.0.0.2:8082"},
		{"peer.example:8082", "10.0.0.1", "peer.example:8082"},
		{"", "10.0.0.1", ""},
		{":8082", "", ":8082"},
	} {
		if got := withHost(tc.addr, tc.ip); got != tc.want {
			t.Errorf("withHost(%q, %q) = %q, want %q", tc.addr, tc.ip, got, tc.want)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	in := meta{Peer: "10.0.0.1:8082", GRPC: "10.0.0.1:8081"}
	b, err := encodeMeta(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeMeta(b)
	if err != nil || out != in {
		t.Errorf("decodeMeta(encodeMeta(%v)) = %v, %v", in, out, err)
	}
	for _, bad := range []string{"", "not json", `{"grpc":"x:1"}`} {
		if _, err := decodeMeta([]byte(bad)); err == nil {
			t.Errorf("decodeMeta(%q) succeeded", bad)
		}
	}
}

// silent is a TCP listener that accepts connections and never answers on
// them: a join address there holds memberlist's Join for its TCPTimeout,
// or until hangUp.
type silent struct {
	addr  string
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// silentListener starts a silent listener on loopback, hung up when the
// test ends if not before.
func silentListener(t *testing.T) *silent {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silent{addr: l.Addr().String(), l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.hangUp)
	return s
}

// hangUp closes the listener and every connection it accepted; it may be
// called more than once.
func (s *silent) hangUp() {
	s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}
