package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
)

// keyOwnedBy returns a key, named prefix and a number, that node i owns.
func (c *testCluster) keyOwnedBy(i int, prefix string) string {
	r := c.nodes[0].Cluster().Ring()
	for k := 0; ; k++ {
		key := fmt.Sprint(prefix, k)
		if o, _ := r.Owner(key); o.Name == c.nodes[i].Cluster().LocalMember().Name {
			return key
		}
	}
}

// series reads one series from a node's /metrics.
func series(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	v, err := metricValue(httpAddr, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rawLessee is a raw gRPC lessee of one node, for driving the protocol by
// hand.
type rawLessee struct {
	rl     pb.RateLimiterClient
	secret []byte
}

func newRawLessee(t *testing.T, grpcAddr, secret string) *rawLessee {
	t.Helper()
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &rawLessee{rl: pb.NewRateLimiterClient(cc), secret: []byte(fmt.Sprintf("%-16s", secret))[:16]}
}

func (l *rawLessee) lease(t *testing.T, reports ...*pb.LeaseReport) []*pb.LeaseGrant {
	t.Helper()
	resp, err := l.rl.Lease(context.Background(), &pb.LeaseRequest{Lessee: l.secret, Reports: reports})
	if err != nil {
		t.Fatalf("lease: %v", err)
	}
	return resp.GetGrants()
}

// unlentOf is what the counter of item has not lent out, as its owner,
// at grpcAddr, answers a GLOBAL check of no hits (less what it lent).
func unlentOf(t *testing.T, grpcAddr string, item *pb.CheckItem) int64 {
	t.Helper()
	cl, err := client.New(grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	probe := &pb.CheckItem{Name: item.Name, Key: item.Key, Limit: item.Limit, DurationMs: item.DurationMs, Algorithm: item.Algorithm,
		Behavior: pb.Behavior_GLOBAL, Hits: ptr(int64(0))}
	resp, err := cl.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{probe}})
	if err != nil || resp.GetResponses()[0].GetError() != "" {
		t.Fatalf("probe: %v %v", resp, err)
	}
	return resp.GetResponses()[0].GetRemaining()
}

// TestLeaseProtocolOverCluster drives the lessee protocol by hand over
// real gRPC, through a node that relays to the key's owner: the first
// report decided and a grant lent; reports acknowledged, and charged once
// however often they are sent; an account that another secret cannot
// touch; usage beyond the grant not charged; a give-back; a lessee that
// never reports again, whose grant is freed after the time-to-live; and
// bad input.
func TestLeaseProtocolOverCluster(t *testing.T) {
	c := startCluster(t, 3, "--lease-ttl", "500ms", "--global-sync", "100ms")
	key := c.keyOwnedBy(2, "lease:")
	owner := c.nodes[2].HTTPAddr()
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 1000, DurationMs: 3_600_000, Algorithm: pb.Algorithm_FIXED_WINDOW}
	a := newRawLessee(t, c.nodes[0].GRPCAddr(), "lessee a")

	g := a.lease(t, &pb.LeaseReport{Item: item, Epoch: 7, Asked: 1, Hits: 1})[0]
	if g.GetError() != "" || g.GetDecided().GetStatus() != pb.Status_UNDER_LIMIT || g.GetGranted() == 0 || g.GetTtlMs() != 500 {
		t.Fatalf("first report, relayed: %v; want its hit decided and a grant", g)
	}
	granted := g.GetGranted()
	// All of it used, reported three times: charged once.
	rep := &pb.LeaseReport{Item: item, Epoch: 7, Admitted: granted, Asked: granted + 1, Granted: granted}
	for range 3 {
		if g = a.lease(t, rep)[0]; g.GetAcked() != granted {
			t.Fatalf("report of %d admitted: %v, want them acknowledged", granted, g)
		}
	}
	if got, want := unlentOf(t, c.nodes[2].GRPCAddr(), item), 1000-1-g.GetGranted(); got != want {
		t.Errorf("unlent %d after the reports, want %d: the limit less the decided hit and what the lessee holds", got, want)
	}

	// Another secret, claiming a's epoch and totals and more: its own account.
	held := g.GetGranted() - g.GetAcked()
	forger := newRawLessee(t, c.nodes[1].GRPCAddr(), "a guess")
	fg := forger.lease(t, &pb.LeaseReport{Item: item, Epoch: 7, Admitted: granted + 5, Acked: granted, Asked: granted + 5, Granted: 1_000_000})[0]
	if fg.GetError() != "" {
		t.Fatal(fg.GetError())
	}
	if g2 := a.lease(t, rep)[0]; g2.GetGranted() != g.GetGranted() || g2.GetAcked() != granted {
		t.Errorf("a's account after the forgery: %v, want it as it was (granted %d, acked %d)", g2, g.GetGranted(), granted)
	}
	if got := unlentOf(t, c.nodes[2].GRPCAddr(), item); got+held+fg.GetGranted()-fg.GetAcked() > 1000-1-granted-5 {
		t.Errorf("unlent %d beside a's %d and the forger's %d: a's hits lent twice", got, held, fg.GetGranted()-fg.GetAcked())
	}

	// More admitted than lent: acknowledged, not charged beyond the grant.
	over := &pb.LeaseReport{Item: item, Epoch: 7, Admitted: g.GetGranted() + 10, Acked: granted, Asked: g.GetGranted() + 11, Granted: g.GetGranted()}
	if g = a.lease(t, over)[0]; g.GetAcked() != over.GetAdmitted() {
		t.Errorf("over-report: %v, want %d acknowledged", g, over.GetAdmitted())
	}
	if got := series(t, owner, "ringlimit_lease_excess_hits_total"); got != 10 {
		t.Errorf("ringlimit_lease_excess_hits_total on the owner = %v, want 10", got)
	}

	// A give-back: nothing held under the next epoch.
	back := &pb.LeaseReport{Item: item, Epoch: 8, Admitted: over.GetAdmitted(), Acked: g.GetAcked(), Asked: over.GetAsked(), Granted: over.GetAdmitted(), Release: true}
	if g = a.lease(t, back)[0]; g.GetEpoch() != 8 || g.GetGranted() != g.GetAcked() {
		t.Errorf("give-back: %v, want nothing held under epoch 8", g)
	}

	// A lessee that never reports after its first call (of another key:
	// the forger, silent too, holds what this one's was not lent): freed
	// after the TTL.
	item = &pb.CheckItem{Name: "api", Key: c.keyOwnedBy(2, "silent:"), Limit: 1000, DurationMs: 3_600_000}
	silent := newRawLessee(t, c.nodes[1].GRPCAddr(), "silent")
	if sg := silent.lease(t, &pb.LeaseReport{Item: item, Epoch: 1, Asked: 500, Hits: 1})[0]; sg.GetGranted() == 0 {
		t.Fatalf("silent lessee: %v, want a grant", sg)
	}
	before := unlentOf(t, c.nodes[2].GRPCAddr(), item)
	deadline := time.Now().Add(10 * time.Second)
	for unlentOf(t, c.nodes[2].GRPCAddr(), item) <= before {
		if time.Now().After(deadline) {
			t.Fatal("the silent lessee's grant was not freed within 10s of a 500ms time-to-live")
		}
		time.Sleep(100 * time.Millisecond) // polling: the owner's rounds free it
	}
	if got := series(t, owner, "ringlimit_lease_expired_total"); got == 0 {
		t.Error("ringlimit_lease_expired_total = 0 after a grant expired")
	}

	// Bad input.
	if _, err := a.rl.Lease(context.Background(), &pb.LeaseRequest{Lessee: []byte("short")}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a 5-byte secret: %v, want InvalidArgument", err)
	}
	keyed := func(k string) *pb.CheckItem {
		return &pb.CheckItem{Name: "api", Key: k, Limit: 1000, DurationMs: 3_600_000}
	}
	bad := a.lease(t,
		&pb.LeaseReport{Item: keyed("bad:1"), Epoch: 7, Admitted: -1},
		&pb.LeaseReport{Item: keyed("bad:2"), Epoch: 1 << 62, Admitted: 1 << 62, Asked: 1 << 62},
		&pb.LeaseReport{Item: &pb.CheckItem{Name: "api", Key: "bad:3", DurationMs: 1000}, Epoch: 1},
	)
	for i, field := range []string{"admitted", "epoch", "limit"} {
		if bad[i].GetErrorCode() != pb.ErrorCode_INVALID_ARGUMENT || !strings.Contains(bad[i].GetError(), field) {
			t.Errorf("bad report %d: %v %q, want INVALID_ARGUMENT naming %s", i, bad[i].GetErrorCode(), bad[i].GetError(), field)
		}
	}
}

// TestLeaseBoundsOverCluster: thousands of lessees on one key, and
// thousands of keys of one lessee, are held to the bounds: reports beyond
// them are answered UNAVAILABLE naming the flag, counted, and hold no
// account.
func TestLeaseBoundsOverCluster(t *testing.T) {
	c := startCluster(t, 2, "--max-leases-per-key", "100", "--max-keys-per-lessee", "50", "--lease-ttl", "1m") // no account expires meanwhile
	key := c.keyOwnedBy(1, "bounded:")
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 1_000_000, DurationMs: 3_600_000}
	var refused atomic.Int64
	var wg sync.WaitGroup
	for w := range 20 {
		l := newRawLessee(t, c.nodes[w%2].GRPCAddr(), "")
		wg.Go(func() {
			for i := range 100 { // 2,000 lessees on one key, each a secret of its own
				resp, err := l.rl.Lease(context.Background(), &pb.LeaseRequest{Lessee: fmt.Appendf(nil, "%016d", w*100+i),
					Reports: []*pb.LeaseReport{{Item: item, Epoch: 1, Asked: 1, Hits: 1}}})
				if err != nil {
					t.Error(err)
					return
				}
				g := resp.GetGrants()[0]
				if g.GetErrorCode() == pb.ErrorCode_UNAVAILABLE && strings.Contains(g.GetError(), "--max-leases-per-key") {
					refused.Add(1)
				} else if g.GetError() != "" {
					t.Errorf("lessee %d-%d: %s", w, i, g.GetError())
				}
			}
		})
	}
	wg.Wait()
	if got := refused.Load(); got != 1900 {
		t.Errorf("%d of 2,000 lessees refused, want 1,900 beyond --max-leases-per-key 100", got)
	}
	owner := c.nodes[1].HTTPAddr()
	if got := series(t, owner, "ringlimit_lease_accounts"); got > 100 {
		t.Errorf("ringlimit_lease_accounts = %v on the owner, want at most 100", got)
	}
	if got := series(t, owner, `ringlimit_lease_refused_total{reason="per_key"}`); got != 1900 {
		t.Errorf("ringlimit_lease_refused_total{reason=per_key} = %v, want 1900", got)
	}

	one := newRawLessee(t, c.nodes[0].GRPCAddr(), "many keys")
	perNode := map[string]int{}
	taken := 0
	for batch := range 3 { // 3,000 keys, 1,000 a call
		var reports []*pb.LeaseReport
		for i := range 1000 {
			k := fmt.Sprint("many:", batch, ":", i)
			reports = append(reports, &pb.LeaseReport{Item: &pb.CheckItem{Name: "api", Key: k, Limit: 100, DurationMs: 60_000}, Epoch: 1, Asked: 1, Hits: 1})
			o, _ := c.nodes[0].Cluster().Ring().Owner(k)
			perNode[o.Name]++
		}
		for _, g := range one.lease(t, reports...) {
			switch {
			case g.GetError() == "":
				taken++
			case !strings.Contains(g.GetError(), "--max-keys-per-lessee"):
				t.Errorf("a key beyond the bound: %s", g.GetError())
			}
		}
	}
	if taken != 100 {
		t.Errorf("%d of 3,000 keys of one lessee taken, want 50 on each of the 2 owners (%v)", taken, perNode)
	}
}

// TestLeasedClientsOverCluster: Go clients of each node, and one that
// routes, lease one key and ask far more than its limit together: never
// more than the limit is admitted, and once they have closed (giving
// their grants back) the rest of it is still there to be admitted.
func TestLeasedClientsOverCluster(t *testing.T) {
	c := startCluster(t, 3)
	l := client.Limit{Name: "api", Count: 2000, Period: time.Hour, Algorithm: client.SlidingLog, Lease: true}
	key := c.keyOwnedBy(2, "shared:")
	clients := []*client.Client{c.clients[0], c.clients[1], c.routingClient(t)}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i, cl := range clients {
		for range 10 {
			wg.Go(func() {
				for range 150 {
					d, err := cl.Take(context.Background(), l, key, 1)
					if err != nil {
						t.Errorf("client %d: %v", i, err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got > 2000 {
		t.Fatalf("%d admitted by leased clients of 3 nodes, over the limit 2000", got)
	}
	for _, cl := range clients {
		cl.Close()
	}
	after, err := client.New(c.nodes[0].GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 2000, DurationMs: 3_600_000, Algorithm: pb.Algorithm_SLIDING_LOG, Hits: ptr(int64(0))}
	resp, err := after.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil {
		t.Fatal(err)
	}
	if rest := resp.GetResponses()[0].GetRemaining(); admitted.Load()+rest != 2000 {
		t.Errorf("%d admitted by the clients and %d left after they closed, want exactly the limit 2000 in all: every hit reported, every grant given back", admitted.Load(), rest)
	}
}
