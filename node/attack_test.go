package node_test

// The attacks of issue 24 on identity and on the peer codec, each
// performed against real nodes (real gRPC, real memberlist, the test
// PKI) and seen to fail.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/node"
	"github.com/ringlimit/ringlimit/node/nodetest"
	"github.com/ringlimit/ringlimit/peer"
)

// secure is a cluster started as SECURITY.md says: a certificate per
// node name from one CA, mutual TLS on the peer port, a gossip key.
type secure struct {
	ca    *testpki.CA
	key   []byte
	dir   string
	nodes []*node.Node
	stops []func() error // of nodes, by index
}

// startSecure starts n nodes, node-0 .. node-(n-1), and waits until each
// ring holds them all.
func startSecure(t *testing.T, n int) *secure { return startSecureWith(t, n, nil) }

// startSecureWith is startSecure with each node's Config changed by
// configure (nil: none) before it starts.
func startSecureWith(t *testing.T, n int, configure func(i int, c *node.Config)) *secure {
	t.Helper()
	s := &secure{ca: testpki.NewCA(t, "cluster"), key: []byte(strings.Repeat("k", 32)), dir: t.TempDir()}
	for i := range n {
		c := s.config(t, i)
		if configure != nil {
			configure(i, &c)
		}
		nd, stop := nodetest.Start(t, c)
		s.nodes, s.stops = append(s.nodes, nd), append(s.stops, stop)
	}
	s.waitRings(t, n)
	return s
}

// config is the Config of node-i: its own certificate, the gossip key,
// and node-0 to join through.
func (s *secure) config(t *testing.T, i int) node.Config {
	t.Helper()
	name := fmt.Sprintf("node-%d", i)
	c := nodetest.Config(name)
	f := s.ca.Issue(t, name, name).Write(t, s.dir, name, s.ca)
	c.PeerTLS = tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}
	c.GossipKeys = [][]byte{s.key}
	if i > 0 {
		c.Join = []string{s.nodes[0].Cluster().GossipAddr()}
	}
	return c
}

// waitRings waits until every node's ring holds n members.
func (s *secure) waitRings(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok := true
		for _, nd := range s.nodes {
			ok = ok && nd.Cluster().Ring().Len() == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rings did not hold %d members within 20s", n)
		}
	}
}

// peerClient dials addr's peer port with a certificate from ca naming
// name (an impostor's or a stolen one), or in plaintext if ca is nil.
func peerClient(t *testing.T, addr string, ca *testpki.CA, name string) peerpb.PeerClient {
	t.Helper()
	return peerpb.NewPeerClient(peerConn(t, addr, ca, name))
}

// peerConn is peerClient's connection.
func peerConn(t *testing.T, addr string, ca *testpki.CA, name string) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if ca != nil {
		f := ca.Issue(t, name, name).Write(t, t.TempDir(), "c", ca)
		src, err := tlsfiles.Load(tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, nil)
		if err != nil {
			t.Fatal(err)
		}
		creds = credentials.NewTLS(src.ClientConfig(""))
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// checker checks through n's public gRPC port.
func checker(t *testing.T, n *node.Node) pb.RateLimiterClient {
	t.Helper()
	cc, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewRateLimiterClient(cc)
}

// spent is a user's limit of 3 an hour, the hits asked.
func spent(user string, hits int64) *pb.CheckItem {
	return &pb.CheckItem{Name: "attack", Key: user, Limit: 3, DurationMs: 3_600_000, Hits: &hits}
}

// remaining returns what user has left, asked through c.
func remaining(t *testing.T, c pb.RateLimiterClient, user string) int64 {
	t.Helper()
	resp, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{spent(user, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResponses()[0]
	if r.GetError() != "" {
		t.Fatalf("check %s: %s", user, r.GetError())
	}
	return r.GetRemaining()
}

// spendUsers spends the limit of n users through c.
func spendUsers(t *testing.T, c pb.RateLimiterClient, n int) []string {
	t.Helper()
	var users []string
	for i := range n {
		u := fmt.Sprintf("user:%d", i)
		if _, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{spent(u, 3)}}); err != nil {
			t.Fatal(err)
		}
		users = append(users, u)
	}
	return users
}

// metrics returns n's /metrics.
func metrics(t *testing.T, n *node.Node) string {
	t.Helper()
	resp, err := http.Get("http://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metric returns the value of series on n's /metrics, or -1.
func metric(t *testing.T, n *node.Node, series string) float64 {
	t.Helper()
	body := metrics(t, n)
	i := strings.Index(body, "\n"+series+" ")
	if i < 0 {
		return -1
	}
	v, _, _ := strings.Cut(body[i+len(series)+2:], "\n")
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s %s: %v", series, v, err)
	}
	return f
}

// fake is a member gossip announces: it holds the gossip key (or not) and
// announces a peer port of its choice.
func startFake(t *testing.T, ctx context.Context, name string, key []byte, peerAddr, join string) {
	t.Helper()
	var keys [][]byte
	if key != nil {
		keys = [][]byte{key}
	}
	c, err := cluster.New(cluster.Config{NodeName: name, BindAddr: "127.0.0.1:0", PeerAddr: peerAddr, Join: []string{join},
		Keys: keys, Memberlist: memberlist.DefaultLocalConfig(), JoinRetry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { <-done })
}

// fakePeerPort serves TLS with cert on a loopback port and drops every
// connection after the handshake: the peer port a fake announces.
func fakePeerPort(t *testing.T, cert testpki.Pair) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.TLS(t)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return lis.Addr().String()
}

// TestFakeMembersStayOffTheRing is the first hole of issue 24: ten fake
// members that hold the gossip key, and either a certificate the cluster
// CA issued for another name (one compromised pod, or another service of
// the same CA) or no cluster certificate at all, join the gossip of a
// three-node cluster. Before, they took 78% (or 76%) of the ring, and
// spent users were admitted again. Now every real node sees them, checks
// their peer ports itself, and leaves them out: the rings hold the three,
// the fakes are no members (so their calls are refused), every refusal is
// counted, and the spent users stay spent on every node (no counter was
// handed to a fake, no check fell back to a share).
func TestFakeMembersStayOffTheRing(t *testing.T) {
	s := startSecure(t, 3)
	users := spendUsers(t, checker(t, s.nodes[0]), 50)
	other := testpki.NewCA(t, "not the cluster's")
	for _, tc := range []struct {
		name, prefix string // the fakes' names: prefix and a number
		// port returns the peer port fake i announces.
		port func(i int) string
	}{
		{"cluster certificate of another name", "stolen-", func(i int) string {
			if i%2 == 0 { // a real node's port, whose certificate names that node
				return s.nodes[i%3].PeerAddr()
			}
			return fakePeerPort(t, s.ca.Issue(t, "ingress.example", "ingress.example"))
		}},
		{"gossip key alone", "keyonly-", func(i int) string {
			if i%2 == 0 {
				return fakePeerPort(t, other.Issue(t, fmt.Sprintf("fake-%d", i), fmt.Sprintf("fake-%d", i)))
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0") // plaintext: accepts and says nothing
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lis.Close() })
			return lis.Addr().String()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failures := make([]float64, len(s.nodes))
			for i, n := range s.nodes {
				failures[i] = metric(t, n, "ringlimit_cluster_admission_failures_total")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var fakes []string
			prefix := tc.prefix
			for i := range 10 {
				name := fmt.Sprintf("%s%d", prefix, i)
				fakes = append(fakes, name)
				startFake(t, ctx, name, s.key, tc.port(i), s.nodes[i%3].Cluster().GossipAddr())
			}
			// Every node sees every fake alive, has refused each, and
			// counts the ten as not admitted.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				ok := true
				for i, n := range s.nodes {
					alive := 0
					for _, m := range n.Cluster().Members() {
						if strings.HasPrefix(m.Name, prefix) && m.State == cluster.Alive {
							alive++
						}
					}
					ok = ok && alive == 10 && metric(t, n, "ringlimit_cluster_admission_failures_total") >= failures[i]+10 &&
						metric(t, n, "ringlimit_cluster_members_unadmitted") == 10
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the nodes did not see and refuse the ten fakes within 30s")
				}
			}
			for i, n := range s.nodes {
				if got := n.Cluster().Ring().Len(); got != 3 {
					t.Errorf("node-%d's ring holds %d members, want the 3 real ones", i, got)
				}
				for _, f := range fakes {
					if n.Cluster().Member(f) {
						t.Errorf("node-%d takes %s for a member", i, f)
					}
				}
				c := checker(t, n)
				for _, u := range users {
					if r := remaining(t, c, u); r != 0 {
						t.Fatalf("node-%d: spent %s has %d remaining with fakes in the gossip", i, u, r)
					}
				}
			}
			cancel()
		})
	}
}

// TestForwardFromNonMemberRefused is the second hole's first half: a
// certificate the cluster CA issued for a name that is no member
// (stranger), and the certificate of a member that has left, could call
// Forward, and a forwarded check with reset: true refilled a spent key.
// Now Forward, as every peer call, is taken only from a certificate
// naming a current member other than the receiver: the call is refused
// and the key stays spent.
func TestForwardFromNonMemberRefused(t *testing.T) {
	s := startSecure(t, 2)
	n := s.nodes[0]
	user := "user:reset"
	for i := 0; ; i++ { // a key node-0 owns, so that it decides the forward itself
		user = fmt.Sprintf("user:reset-%d", i)
		if o, _ := n.Cluster().Ring().Owner(user); o.Name == "node-0" {
			break
		}
	}
	c := checker(t, n)
	if _, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{spent(user, 3)}}); err != nil {
		t.Fatal(err)
	}
	reset := spent(user, 1)
	reset.Reset_ = true
	for _, name := range []string{"stranger", "node-0"} { // node-0: the receiver's own name
		_, err := peerClient(t, n.PeerAddr(), s.ca, name).Forward(t.Context(),
			&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{reset}}}})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("Forward with reset from a certificate for %s: %v, want PermissionDenied", name, err)
		}
	}
	if r := remaining(t, c, user); r != 0 {
		t.Errorf("spent key has %d remaining after refused forwards with reset, want 0", r)
	}
	if got := metric(t, n, `ringlimit_peer_refused_total{reason="no_member"}`); got < 2 {
		t.Errorf(`ringlimit_peer_refused_total{reason="no_member"} = %v, want 2`, got)
	}
}

// TestCompromisedMember performs what SECURITY.md says one compromised
// member can still do, with its certificate (node-1's), and what it
// cannot: it can send forwarded checks as the clients it serves could,
// reset included (a client of any node's public port can send reset: the
// member adds no power over counters); it cannot speak as another member
// (a hand-off as node-0 is refused as wrong_name), nor as the receiver.
func TestCompromisedMember(t *testing.T) {
	s := startSecure(t, 2)
	n := s.nodes[0]
	stolen := peerClient(t, n.PeerAddr(), s.ca, "node-1")
	user := "user:0"
	for i := 0; ; i++ {
		user = fmt.Sprintf("user:%d", i)
		if o, _ := n.Cluster().Ring().Owner(user); o.Name == "node-0" {
			break
		}
	}
	c := checker(t, n)
	if _, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.CheckItem{spent(user, 3)}}); err != nil {
		t.Fatal(err)
	}
	reset := spent(user, 1)
	reset.Reset_ = true
	if _, err := stolen.Forward(t.Context(), &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{reset}}}}); err != nil {
		t.Fatalf("a member's forward with reset: %v, want it taken (as a client's check would be)", err)
	}
	if r := remaining(t, c, user); r != 2 {
		t.Errorf("after a member's forwarded reset and one hit: %d remaining, want 2", r)
	}
	for _, from := range []string{"node-0", "node-9"} {
		_, err := stolen.HandOff(t.Context(), &peerpb.HandOffRequest{From: from, Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("HandOff as %s with node-1's certificate: %v, want PermissionDenied", from, err)
		}
	}
}

// TestOwnNameIsNoCredential is the fifth hole's last part: on a bare
// node (no TLS, no gossip key) a caller naming itself as the receiving
// node had HandOff, Replicate and ForwardStream accepted, for the node's
// own name is a member's. A node never calls itself: the name is refused.
func TestOwnNameIsNoCredential(t *testing.T) {
	n, _ := nodetest.Start(t, nodetest.Config("solo"))
	p := peerClient(t, n.PeerAddr(), nil, "")
	counters := []*peerpb.CounterState{{Counter: []byte{1}}}
	if _, err := p.HandOff(t.Context(), &peerpb.HandOffRequest{From: "solo", Counters: counters}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("HandOff from the node's own name: %v, want PermissionDenied", err)
	}
	if _, err := p.Replicate(t.Context(), &peerpb.ReplicateRequest{From: "solo", Counters: counters}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Replicate from the node's own name: %v, want PermissionDenied", err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), peer.SenderHeader, "solo")
	stream, err := p.ForwardStream(ctx)
	if err == nil {
		if err = stream.CloseSend(); err == nil {
			_, err = stream.Recv() // a stream taken ends with io.EOF
		}
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("ForwardStream from the node's own name: %v, want PermissionDenied", err)
	}
}

// rawCodec sends *[]byte as it is, so that a test sends what no honest
// encoder would.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// bomb is a ForwardRequest (or ForwardStreamRequest: the same field 1)
// of one check request of empty items, just under the peer port's
// receive limit: two bytes an item, about two million.
func bomb() []byte {
	n := (peer.MaxMessageBytes - 16) / 2
	items := make([]byte, 0, 2*n)
	for range n {
		items = protowire.AppendTag(items, 1, protowire.BytesType)
		items = protowire.AppendVarint(items, 0)
	}
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, items)
}

// peakHeap runs attack and returns how far the heap grew above where it
// was before, at its highest, sampled every millisecond.
func peakHeap(attack func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > base && ms.HeapAlloc-base > peak.Load() {
				peak.Store(ms.HeapAlloc - base)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	attack()
	close(stop)
	wg.Wait()
	return peak.Load()
}

// maxBombHeap bounds the heap growth of eight bombs in parallel: their
// bytes on both ends (the test's client and the node share the process),
// 8 × 4 MiB sent, received and materialized once, about 100 MB. Decoded
// as before, one bomb built about 400 MB.
const maxBombHeap = 256 << 20

// TestPeerBombsBoundedMemory is the second hole's second half: a member's
// Forward of 4 MiB of empty items took a node from 31 MB to 3.2 GB (8 in
// parallel), and a forged ForwardStream batch to 411 MB. With a member's
// certificate (node-1's, stolen), both are refused before their items are
// built, and the process's heap stays within maxBombHeap.
func TestPeerBombsBoundedMemory(t *testing.T) {
	s := startSecure(t, 2)
	n := s.nodes[0]
	stolen := peerConn(t, n.PeerAddr(), s.ca, "node-1")
	msg := bomb()
	raw := grpc.ForceCodecV2(rawCodec{})
	for _, tc := range []struct {
		name string
		send func() error
	}{
		{"Forward", func() error {
			var out []byte
			return stolen.Invoke(t.Context(), "/ringlimit.peer.v1.Peer/Forward", &msg, &out, raw)
		}},
		{"ForwardStream", func() error {
			ctx := metadata.AppendToOutgoingContext(t.Context(), peer.SenderHeader, "node-1")
			st, err := stolen.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/ringlimit.peer.v1.Peer/ForwardStream", raw)
			if err != nil {
				return err
			}
			if err := st.SendMsg(&msg); err != nil {
				return err
			}
			var out []byte
			if err := st.RecvMsg(&out); err != nil {
				return err
			}
			return fmt.Errorf("answered with %d bytes", len(out))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([]error, 8)
			grew := peakHeap(func() {
				var wg sync.WaitGroup
				for i := range errs {
					wg.Go(func() { errs[i] = tc.send() })
				}
				wg.Wait()
			})
			for i, err := range errs {
				if err == nil {
					t.Errorf("bomb %d: taken", i)
				}
			}
			if grew > maxBombHeap {
				t.Errorf("eight 4 MiB bombs grew the heap by %d MB, want at most %d", grew>>20, maxBombHeap>>20)
			}
			t.Logf("eight bombs grew the heap by %d MB at most; the first refusal: %v", grew>>20, errs[0])
		})
	}
}
