package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// fakeLender records what it is lent for and answers each report with a
// grant of its admitted hits plus ten, or ErrNotOwner for keys starting
// with "not-mine".
type fakeLender struct {
	mu      sync.Mutex
	lessees []global.Lessee
	keys    []string
}

func (f *fakeLender) Lend(lessee global.Lessee, reports []global.LeaseReport) []global.LeaseGrant {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]global.LeaseGrant, len(reports))
	for i, r := range reports {
		f.lessees = append(f.lessees, lessee)
		f.keys = append(f.keys, r.Request.Key)
		if strings.HasPrefix(r.Request.Key, "not-mine") {
			out[i].Err = fmt.Errorf("key %q: %w", r.Request.Key, global.ErrNotOwner)
			continue
		}
		out[i] = global.LeaseGrant{Epoch: r.Epoch, Granted: r.Admitted + 10, Acked: r.Admitted, TTL: time.Second,
			Remaining: 5, Decided: r.Request.Hits > 0, Decision: algorithms.Decision{Allowed: true}}
	}
	return out
}

// fakeMembership is member self of ring r.
type fakeMembership struct {
	r    *ring.Ring
	self ring.Member
}

func (m fakeMembership) Ring() *ring.Ring         { return m.r }
func (m fakeMembership) LocalMember() ring.Member { return m.self }

// fakePeers relays to the Nodes of this process, by peer address; those
// in down cannot be reached.
type fakePeers struct {
	nodes map[string]*Node
	down  map[string]bool
}

func (p *fakePeers) Lease(ctx context.Context, addr, from string, lessee []byte, reports []*pb.LeaseReport) ([]*pb.LeaseGrant, error) {
	if p.down[addr] {
		return nil, errors.New("unreachable")
	}
	return p.nodes[addr].Relayed(ctx, from, lessee, reports)
}

// testNodes returns a Node for each name, of one ring, each with its own
// fakeLender.
func testNodes(names ...string) (map[string]*Node, map[string]*fakeLender, *fakePeers, *ring.Ring) {
	var members []ring.Member
	for _, n := range names {
		members = append(members, ring.Member{Name: n, PeerAddr: n})
	}
	r := ring.New(members...)
	peers := &fakePeers{nodes: map[string]*Node{}, down: map[string]bool{}}
	lenders := map[string]*fakeLender{}
	for _, m := range members {
		lenders[m.Name] = &fakeLender{}
		peers.nodes[m.Name] = New(Config{Lender: lenders[m.Name], Cluster: fakeMembership{r, m}, Peers: peers,
			MaxClockSkew: time.Minute, Result: result, Now: func() time.Time { return t0 }})
	}
	return peers.nodes, lenders, peers, r
}

// validate is a small stand-in for the service's check of an item.

func result(res *pb.CheckResult, r *limiter.Request, d algorithms.Decision) {
	res.Limit, res.Remaining = r.Limit.Count, d.Remaining
	if !d.Allowed {
		res.Status = pb.Status_OVER_LIMIT
	}
}

func report(key string, admitted int64) *pb.LeaseReport {
	return &pb.LeaseReport{Item: &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000}, Epoch: 3, Admitted: admitted, Asked: admitted}
}

// keyOf returns a key r gives to owner, named prefix and a number from
// from on.
func keyOf(r *ring.Ring, owner, prefix string, from int) string {
	for i := from; ; i++ {
		k := fmt.Sprint(prefix, i)
		if o, _ := r.Owner(k); o.Name == owner {
			return k
		}
	}
}

// TestLeaseTakesEachReportToItsOwner: a call's reports go to their keys'
// owners, this node's own to its core and the others relayed once, under
// the account named by the secret's hash (never the secret); the answers
// come back in the order of the reports.
func TestLeaseTakesEachReportToItsOwner(t *testing.T) {
	nodes, lenders, _, r := testNodes("a", "b", "c")
	secret := []byte("0123456789abcdef")
	keys := []string{keyOf(r, "b", "k", 0), keyOf(r, "a", "k", 0), keyOf(r, "c", "k", 0), keyOf(r, "b", "k", 100)}
	req := &pb.LeaseRequest{Lessee: secret}
	for i, k := range keys {
		req.Reports = append(req.Reports, report(k, int64(i)))
	}
	req.Reports[1].Hits = 2
	resp, err := nodes["a"].Lease(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range resp.GetGrants() {
		if g.GetError() != "" || g.GetGranted() != int64(i)+10 || g.GetState().GetRemaining() != 5 {
			t.Errorf("grant %d: %v, want the answer to report %d", i, g, i)
		}
	}
	if d := resp.GetGrants()[1].GetDecided(); d == nil || d.GetStatus() != pb.Status_UNDER_LIMIT {
		t.Errorf("the report asking to decide 2 hits: decided %v", d)
	}
	want := map[string][]string{"a": {keys[1]}, "b": {keys[0], keys[3]}, "c": {keys[2]}}
	for name, l := range lenders {
		if fmt.Sprint(l.keys) != fmt.Sprint(want[name]) {
			t.Errorf("%s lent for %v, want %v", name, l.keys, want[name])
		}
		for _, id := range l.lessees {
			if id != global.LesseeOf(secret) {
				t.Errorf("%s lent for account %x, want the secret's hash", name, id)
			}
		}
	}
}

// TestLeaseBadInput: a call with a bad secret or too many reports is
// refused whole; a bad report gets its own INVALID_ARGUMENT naming the
// field, a report for a key whose owner cannot be reached or does not own
// it UNAVAILABLE; the others are answered.
func TestLeaseBadInput(t *testing.T) {
	nodes, _, peers, r := testNodes("a", "b")
	n := nodes["a"]
	for _, secret := range [][]byte{nil, []byte("short"), make([]byte, 17)} {
		if _, err := n.Lease(t.Context(), &pb.LeaseRequest{Lessee: secret}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "lessee") {
			t.Errorf("a secret of %d bytes: %v, want invalid, naming lessee", len(secret), err)
		}
	}
	many := &pb.LeaseRequest{Lessee: make([]byte, 16), Reports: make([]*pb.LeaseReport, MaxReports+1)}
	if _, err := n.Lease(t.Context(), many); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "reports") {
		t.Errorf("%d reports: %v, want invalid, naming reports", MaxReports+1, err)
	}
	mine := keyOf(r, "a", "k", 0)
	with := func(f func(*pb.LeaseReport)) *pb.LeaseReport {
		rep := report(mine, 0)
		f(rep)
		return rep
	}
	peers.down["b"] = true
	reports := []*pb.LeaseReport{
		{},
		with(func(r *pb.LeaseReport) { r.Item.Key = "" }),
		with(func(r *pb.LeaseReport) { r.Item.Policy = "d/k=v" }),
		with(func(r *pb.LeaseReport) { r.Item.MinIntervalMs = 5 }),
		with(func(r *pb.LeaseReport) { r.Item.Ceiling = 20 }),
		with(func(r *pb.LeaseReport) { r.Item.ChargeRefused = true }),
		with(func(r *pb.LeaseReport) { r.Item.Reset_ = true }),
		with(func(r *pb.LeaseReport) { r.Hits = -1 }),
		report(mine, 1),
		report(mine, 2), // the same key again
		report(keyOf(r, "b", "k", 0), 0),
		report(keyOf(r, "a", "not-mine-", 0), 0),
	}
	resp, err := n.Lease(t.Context(), &pb.LeaseRequest{Lessee: make([]byte, 16), Reports: reports})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		code  pb.ErrorCode
		field string
	}{
		{pb.ErrorCode_INVALID_ARGUMENT, "item: missing"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item: key"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item.policy"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item.min_interval_ms"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item.ceiling"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item.charge_refused"},
		{pb.ErrorCode_INVALID_ARGUMENT, "item.reset"},
		{pb.ErrorCode_INVALID_ARGUMENT, "hits"},
		{pb.ErrorCode_OK, ""},
		{pb.ErrorCode_INVALID_ARGUMENT, "the same name and key"},
		{pb.ErrorCode_UNAVAILABLE, "owner b"},
		{pb.ErrorCode_UNAVAILABLE, "not the key's owner"},
	}
	for i, g := range resp.GetGrants() {
		if g.GetErrorCode() != want[i].code || !strings.Contains(g.GetError(), want[i].field) {
			t.Errorf("report %d: %v %q, want %v naming %q", i, g.GetErrorCode(), g.GetError(), want[i].code, want[i].field)
		}
	}
	if g := resp.GetGrants()[8]; g.GetGranted() != 11 {
		t.Errorf("the good report beside the bad: %v", g)
	}
}

// TestRelayedNeverRelaysAgain: a relayed report for a key this node does
// not own is answered UNAVAILABLE, not passed on; an account id that is
// not 16 bytes is refused whole.
func TestRelayedNeverRelaysAgain(t *testing.T) {
	nodes, lenders, _, r := testNodes("a", "b")
	grants, err := nodes["a"].Relayed(t.Context(), "b", make([]byte, 16), []*pb.LeaseReport{report(keyOf(r, "b", "not-mine-", 0), 0)})
	if err != nil {
		t.Fatal(err)
	}
	if grants[0].GetErrorCode() != pb.ErrorCode_UNAVAILABLE || len(lenders["b"].keys) != 0 {
		t.Errorf("a report relayed to a node that does not own its key: %v, and b lent %v; want UNAVAILABLE, b untouched", grants[0], lenders["b"].keys)
	}
	if _, err := nodes["a"].Relayed(t.Context(), "b", []byte("secret"), nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("an account id of 6 bytes: %v, want invalid", err)
	}
}
