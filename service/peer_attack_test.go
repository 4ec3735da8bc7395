package service

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// The attacks on the peer port of issue 7, each made over real gRPC on
// loopback against a service's peer server, as cmd/rlnode serves it, by a
// plain client with no credentials (mutual TLS, which would refuse it
// sooner, is configured elsewhere). Each must fail with a clear refusal
// and change nothing.

// servePeer serves s's peer side on 127.0.0.1 as cmd/rlnode does, with
// its metrics in reg, and returns a raw client to it.
func servePeer(t *testing.T, s *Service, reg prometheus.Registerer) peerpb.PeerClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(peer.ServerOptions()...)
	peer.NewServer(s.Owner(), reg).Register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		g.Stop()
		<-done
	})
	return peerpb.NewPeerClient(cc)
}

// TestPeerBoundsMatchThePublicAPI: a node's name may be as long as a
// limit's.
func TestPeerBoundsMatchThePublicAPI(t *testing.T) {
	if peerpb.MaxNodeNameLen < limiter.MaxNameLen {
		t.Errorf("peerpb.MaxNodeNameLen = %d is shorter than a limit's name", peerpb.MaxNodeNameLen)
	}
}

// TestPeerAttackForwardInvalidItems: forwarded items are validated by the
// same function as public checks; each invalid one is answered with its
// error and creates no counter.
func TestPeerAttackForwardInvalidItems(t *testing.T) {
	_, svcs := newFakeCluster(2)
	client := servePeer(t, svcs[0], nil)
	bad := []*pb.CheckItem{
		{Name: "a\x00b", Key: "k", Limit: 10, DurationMs: 1000},
		{Name: "api", Key: strings.Repeat("k", limiter.MaxKeyLen+1), Limit: 10, DurationMs: 1000},
		{Name: strings.Repeat("n", 1<<20), Key: "k", Limit: 10, DurationMs: 1000},
		{Name: "api", Key: "k", Limit: checks.MaxLimit + 1, DurationMs: 1000},
		{Name: "api", Key: "k", Limit: 1_000_000, DurationMs: 1000, Algorithm: pb.Algorithm_SLIDING_LOG},
		{Name: "api", Key: "k", Limit: 10, DurationMs: 1000, CreatedAtMs: t0.Add(365 * 24 * time.Hour).UnixMilli()},
		{Name: "api", Key: "", Limit: 10, DurationMs: 1000},
		{Name: "api", Key: "k", Limit: 10, DurationMs: 1000, Hits: hits(-5)},
	}
	resp, err := client.Forward(t.Context(), &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: bad}}})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResponses()[0].GetResponses() {
		if r.GetError() == "" || r.GetErrorCode() != pb.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("item %d answered %v, want an INVALID_ARGUMENT error", i, r)
		}
	}
	if n := svcs[0].store.Len(); n != 0 {
		t.Errorf("the owner holds %d counters after a forward of invalid items, want 0", n)
	}
}

// globalItem is a GLOBAL check of 900 an hour on key.
func globalItem(key string) *pb.CheckItem {
	return &pb.CheckItem{Name: "api", Key: key, Limit: 900, DurationMs: 3_600_000, Behavior: pb.Behavior_GLOBAL}
}

// remaining is what the owner s's counter for item has left.
func remaining(s *Service, item *pb.CheckItem) int64 {
	r, _ := checks.Request(item, t0, time.Minute)
	r.Hits = 0
	return s.store.Check(&r).Remaining
}

// TestPeerAttackGlobalReportFromStranger: hits reported by a node that is
// not in the cluster are refused whole; the key keeps every hit.
func TestPeerAttackGlobalReportFromStranger(t *testing.T) {
	c, svcs := newFakeCluster(3)
	reg := prometheus.NewRegistry()
	client := servePeer(t, svcs[0], reg)
	item := globalItem(c.keyOwnedBy(0))
	for _, from := range []string{"mallory", "node-0"} { // a stranger, and this node's own name
		_, err := client.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: from, Reports: []*peerpb.GlobalReport{
			{Item: item, Admitted: 1_000_000_000, Epoch: 1},
		}})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a member") {
			t.Errorf("report from %s: %v, want PermissionDenied naming the sender", from, err)
		}
	}
	if svcs[0].store.Len() != 0 || remaining(svcs[0], item) != 900 {
		t.Errorf("after a stranger's report the owner holds %d counters, %d remaining; want none touched", svcs[0].store.Len(), remaining(svcs[0], item))
	}
	if got := metricSum(t, reg, "ringlimit_peer_refused_rpcs_total", "rpc", "global_report", "reason", "unknown_sender"); got != 2 {
		t.Errorf("refused reports counted %v, want 2", got)
	}
}

// TestPeerAttackGlobalReportOverGrant: a member that claims far more hits
// than it was ever granted is charged at most what it could have
// admitted (for a new account, one share: 900/3), and the excess is
// counted; claiming more on the same account charges nothing more.
func TestPeerAttackGlobalReportOverGrant(t *testing.T) {
	regs := make([]*prometheus.Registry, 3)
	c, svcs := newFakeClusterWith(3, func(i int) Config {
		regs[i] = prometheus.NewRegistry()
		return Config{Registerer: regs[i]}
	})
	client := servePeer(t, svcs[0], nil)
	item := globalItem(c.keyOwnedBy(0))
	for _, admitted := range []int64{1_000_000_000, 2_000_000_000} {
		if _, err := client.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "node-1", Reports: []*peerpb.GlobalReport{
			{Item: item, Admitted: admitted, Epoch: 7},
		}}); err != nil {
			t.Fatal(err)
		}
		if got := remaining(svcs[0], item); got != 600 {
			t.Errorf("after a report of %d hits the counter has %d remaining, want 600 (one share charged)", admitted, got)
		}
	}
	if got := metricSum(t, regs[0], "ringlimit_global_excess_hits_total"); got != 2_000_000_000-300 {
		t.Errorf("excess hits counted %v, want %v", got, 2_000_000_000-300)
	}
	if got := metricSum(t, regs[0], "ringlimit_peer_rejected_total", "kind", "global_report", "reason", "over_grant"); got != 2 {
		t.Errorf("over-grant reports counted %v, want 2", got)
	}
}

// TestPeerAttackGlobalReportInvalid: reports that are impossible (counts
// negative or inconsistent, an item the public API would refuse) are
// rejected one by one and charge nothing.
func TestPeerAttackGlobalReportInvalid(t *testing.T) {
	c, svcs, reg := newFakeClusterMetered(3, 0)
	client := servePeer(t, svcs[0], nil)
	item := globalItem(c.keyOwnedBy(0))
	nul := proto.CloneOf(item)
	nul.Name = "a\x00b"
	zero := proto.CloneOf(item)
	zero.Limit = 0
	long := proto.CloneOf(item)
	long.Key = strings.Repeat("k", limiter.MaxKeyLen+1)
	reports := []*peerpb.GlobalReport{
		{Item: item, Admitted: 5, Acked: 6, Epoch: 1},
		{Item: item, Admitted: 5, Epoch: -1},
		{Item: item, Admitted: -5, Acked: -10, Epoch: 1},
		{Item: nul, Admitted: 5, Epoch: 1},
		{Item: zero, Admitted: 5, Epoch: 1},
		{Item: long, Admitted: 5, Epoch: 1},
		{Admitted: 5, Epoch: 1},
	}
	if _, err := client.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "node-1", Reports: reports}); err != nil {
		t.Fatal(err)
	}
	if svcs[0].store.Len() != 0 {
		t.Errorf("invalid reports created %d counters, want 0", svcs[0].store.Len())
	}
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_report", "reason", "invalid"); got != float64(len(reports)) {
		t.Errorf("invalid reports counted %v, want %d", got, len(reports))
	}
}

// TestPeerAttackGrantUpdate: a crafted broadcast cannot lift a GLOBAL
// limit. Node 0 holds a legitimate grant from node 1, the key's owner;
// a broadcast giving it a huge grant from a stranger is refused whole,
// from a member that is not the key's owner rejected, and from the owner
// itself rejected when the grant or times are impossible. Node 0 then
// admits from its grant exactly what the owner lent it.
func TestPeerAttackGrantUpdate(t *testing.T) {
	c, svcs, reg := newFakeClusterMetered(3, 0)
	item := globalItem(c.keyOwnedBy(1))
	var legit *peerpb.GlobalState
	var mu sync.Mutex // broadcasts go to the members concurrently
	c.onUpdate = func(from string, states []*peerpb.GlobalState) {
		mu.Lock()
		defer mu.Unlock()
		for _, st := range states {
			if st.Key == item.Key && from == "node-1" {
				legit = proto.CloneOf(st)
			}
		}
	}
	check(t, svcs[0], item) // no grant yet: decided by the owner, and asks for one
	syncRound(svcs)
	if legit == nil {
		t.Fatal("the owner broadcast no state")
	}
	var lent int64
	for _, gr := range legit.Grants {
		if gr.Node == "node-0" {
			lent = gr.Granted
		}
	}
	if lent <= 0 {
		t.Fatalf("node-0 was lent nothing: %v", legit)
	}

	client := servePeer(t, svcs[0], nil)
	crafted := func(f func(st *peerpb.GlobalState)) []*peerpb.GlobalState {
		st := proto.CloneOf(legit)
		f(st)
		return []*peerpb.GlobalState{st}
	}
	huge := crafted(func(st *peerpb.GlobalState) {
		for _, gr := range st.Grants {
			gr.Granted = 1_000_000_000
		}
	})
	if _, err := client.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: "mallory", States: huge}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a stranger's broadcast: %v, want PermissionDenied", err)
	}
	for _, attack := range []struct {
		from   string
		states []*peerpb.GlobalState
	}{
		{"node-2", huge}, // a member, not the key's owner
		{"node-1", huge}, // the owner, lending more than the limit
		{"node-1", crafted(func(st *peerpb.GlobalState) { st.ResetTimeMs = t0.Add(365 * 24 * time.Hour).UnixMilli() })},
		{"node-1", crafted(func(st *peerpb.GlobalState) { st.Remaining = 1_000_000 })},
		{"node-1", crafted(func(st *peerpb.GlobalState) { st.RetryAfterMs = -1 })},
		{"node-1", crafted(func(st *peerpb.GlobalState) { st.Name = strings.Repeat("n", limiter.MaxNameLen+1) })},
	} {
		if _, err := client.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: attack.from, States: attack.states}); err != nil {
			t.Errorf("broadcast from %s: %v, want taken and its state rejected", attack.from, err)
		}
	}
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_state", "reason", "not_owner"); got != 1 {
		t.Errorf("states from a non-owner counted %v, want 1", got)
	}
	if got := metricSum(t, reg, "ringlimit_peer_rejected_total", "kind", "global_state", "reason", "invalid"); got != 5 {
		t.Errorf("invalid states counted %v, want 5", got)
	}

	// With the owner unreachable, node 0 admits from its grant what it was
	// lent and no more (less the check that asked for it, decided by the
	// owner).
	c.down["peer-1"] = true
	fromGrant := int64(0)
	for range 2 * lent {
		r := check(t, svcs[0], item)
		if r.Status == pb.Status_UNDER_LIMIT && r.Metadata[MetadataDecidedBy] == "" {
			fromGrant++
		}
	}
	if fromGrant != lent {
		t.Errorf("node 0 admitted %d from its grant, want the %d it was lent", fromGrant, lent)
	}
}

// record is a Counter record of a check's own limit (version 1's layout)
// written by hand, so that it can break the bounds AppendBinary keeps.
func record(alg limiter.Algorithm, name, key string, l algorithms.Limit, last int64, state []byte) []byte {
	b := []byte{1, byte(alg)}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	for _, w := range []int64{l.Count, int64(l.Period), l.Burst, last} {
		b = binary.LittleEndian.AppendUint64(b, uint64(w))
	}
	return append(b, state...)
}

// sendCounters sends counters to client by hand-off or replication, the
// two RPCs that carry counters, and returns the answer's accepted count
// and refusals.
type sendCounters func(t *testing.T, client peerpb.PeerClient, from string, counters []*peerpb.CounterState) (int64, []*peerpb.Refusal)

// counterRPCs are the RPCs that carry counters; the same attacks apply to
// both.
var counterRPCs = map[string]sendCounters{
	"HandOff": func(t *testing.T, client peerpb.PeerClient, from string, counters []*peerpb.CounterState) (int64, []*peerpb.Refusal) {
		resp, err := client.HandOff(t.Context(), &peerpb.HandOffRequest{From: from, Counters: counters})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted(), resp.GetRefused()
	},
	"Replicate": func(t *testing.T, client peerpb.PeerClient, from string, counters []*peerpb.CounterState) (int64, []*peerpb.Refusal) {
		resp, err := client.Replicate(t.Context(), &peerpb.ReplicateRequest{From: from, Counters: counters})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAccepted(), resp.GetRefused()
	},
}

// TestPeerAttackCraftedHandOff: crafted counters (out-of-bounds names and
// keys, a bucket locked for a year, times in the future), handed off or
// replicated, are refused one by one as INVALID and change nothing on the
// receiver: neither its counters nor its replicas.
func TestPeerAttackCraftedHandOff(t *testing.T) {
	for rpc, send := range counterRPCs {
		t.Run(rpc, func(t *testing.T) { testCraftedCounters(t, send) })
	}
}

func testCraftedCounters(t *testing.T, send sendCounters) {
	c, svcs := newFakeCluster(2)
	client := servePeer(t, svcs[0], nil)
	key := c.keyOwnedBy(0)
	perSecond := algorithms.Limit{Count: 1, Period: time.Second}
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	now := t0.UnixNano()
	year := 365 * 24 * time.Hour
	bucket := encoded(&algorithms.TokenBucket{Full: now})
	records := [][]byte{
		record(limiter.TokenBucket, strings.Repeat("n", limiter.MaxNameLen+1), key, perSecond, now, bucket),
		record(limiter.TokenBucket, strings.Repeat("n", 65535), key, perSecond, now, bucket),
		record(limiter.TokenBucket, "", key, perSecond, now, bucket),
		record(limiter.TokenBucket, "a\x00b", key, perSecond, now, bucket),
		record(limiter.TokenBucket, "api", strings.Repeat("k", limiter.MaxKeyLen+1), perSecond, now, bucket),
		record(limiter.TokenBucket, "api", "", perSecond, now, bucket),
		record(limiter.TokenBucket, "api", key, perSecond, now, encoded(&algorithms.TokenBucket{Full: t0.Add(year).UnixNano()})),
		record(limiter.TokenBucket, "api", key, perSecond, t0.Add(year).UnixNano(), bucket),
		record(limiter.FixedWindow, "api", key, minute, now, encoded(&algorithms.FixedWindow{Start: t0.Add(time.Hour).Truncate(time.Minute).UnixNano(), Count: 1})),
		record(limiter.TokenBucket, "api", key, algorithms.Limit{Count: checks.MaxLimit * 10, Period: time.Second}, now, bucket),
		{limiter.CounterVersion},
	}
	counters := make([]*peerpb.CounterState, len(records))
	for i, r := range records {
		counters[i] = &peerpb.CounterState{Counter: r}
	}
	accepted, refused := send(t, client, "node-1", counters)
	if accepted != 0 || len(refused) != len(records) {
		t.Fatalf("accepted %d, refused %d of %d crafted counters; want all refused", accepted, len(refused), len(records))
	}
	for _, r := range refused {
		if r.GetReason() != peerpb.Refusal_INVALID || r.GetDetail() == "" {
			t.Errorf("counter %d refused as %v (%q), want INVALID with a reason", r.GetIndex(), r.GetReason(), r.GetDetail())
		}
	}
	if n, m := svcs[0].store.Len(), c.replicas["peer-0"].Len(); n != 0 || m != 0 {
		t.Errorf("the receiver holds %d counters and %d replicas, want none", n, m)
	}
}

// TestPeerAttackReplicaDecidesNothing: a member that replicates a key's
// counter as spent to a node that does not own the key changes none of
// the answers for the key, however often: replicas are never decided
// from, and the owner decides on its own counter. Were the owner to
// crash, the replica would be merged, which never refills: a peer can
// make a counter more charged, as a hand-off or any client of the key
// could, never less.
func TestPeerAttackReplicaDecidesNothing(t *testing.T) {
	c, svcs := newFakeCluster(2)
	client := servePeer(t, svcs[0], nil)
	key := c.keyOwnedBy(1)
	spent := []*peerpb.CounterState{{Counter: record(limiter.TokenBucket, "api", key, algorithms.Limit{Count: 10, Period: time.Minute},
		t0.UnixNano(), encoded(&algorithms.TokenBucket{Full: t0.Add(time.Minute).UnixNano()}))}}
	for range 3 {
		if accepted, refused := counterRPCs["Replicate"](t, client, "node-1", spent); accepted != 1 || len(refused) != 0 {
			t.Fatalf("a valid replica: accepted %d, refused %v", accepted, refused)
		}
	}
	item := &pb.CheckItem{Name: "api", Key: key, Limit: 10, DurationMs: 60_000}
	for i := range 10 {
		if r := check(t, svcs[0], item); r.Status != pb.Status_UNDER_LIMIT || r.Remaining != int64(9-i) {
			t.Fatalf("check %d of a key with a spent replica on the node asked: %v; want decided on the owner's counter", i, r)
		}
	}
	if n, m := svcs[0].store.Len(), c.replicas["peer-0"].Len(); n != 0 || m != 1 {
		t.Errorf("the heir holds %d counters and %d replicas, want the replica alone", n, m)
	}
}

// TestPeerAttackHandOffRefill: a spent counter cannot be refilled by a
// crafted hand-off, again and again: neither by a fixed window that
// begins later (within the allowed clock skew), which would replace the
// current window and its count, nor by a bucket evaluated later, which
// would refill by the difference. Both counters stay spent.
func TestPeerAttackHandOffRefill(t *testing.T) {
	c, svcs := newFakeCluster(2)
	client := servePeer(t, svcs[0], nil)
	key := c.keyOwnedBy(0)
	minute := algorithms.Limit{Count: 10, Period: time.Minute}
	window := &pb.CheckItem{Name: "window", Key: key, Limit: 10, DurationMs: 60_000, Algorithm: pb.Algorithm_FIXED_WINDOW}
	bucket := &pb.CheckItem{Name: "bucket", Key: key, Limit: 10, DurationMs: 60_000}
	for _, item := range []*pb.CheckItem{window, bucket} {
		for range 10 {
			check(t, svcs[0], item)
		}
	}
	nextWindow := &algorithms.FixedWindow{Start: t0.Truncate(time.Minute).Add(time.Minute).UnixNano()}
	records := []*peerpb.CounterState{
		{Counter: record(limiter.FixedWindow, "window", key, minute, t0.UnixNano(), encoded(nextWindow))},
		{Counter: record(limiter.TokenBucket, "bucket", key, minute, t0.Add(9*time.Minute).UnixNano(), encoded(&algorithms.TokenBucket{Full: t0.UnixNano()}))},
	}
	for range 3 {
		resp, err := client.HandOff(t.Context(), &peerpb.HandOffRequest{From: "node-1", Counters: records})
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.GetRefused(); len(r) != 1 || r[0].GetIndex() != 0 || r[0].GetReason() != peerpb.Refusal_INVALID {
			t.Errorf("refused %v, want the window that begins later refused as INVALID", r)
		}
	}
	for _, item := range []*pb.CheckItem{window, bucket} {
		if r := check(t, svcs[0], item); r.Status != pb.Status_OVER_LIMIT {
			t.Errorf("spent %s counter after crafted hand-offs: %v, want OVER_LIMIT", item.Name, r)
		}
	}
}

// FuzzPeerHandlers feeds arbitrary bytes, decoded as each peer request,
// to a node's peer server (in process, as gRPC would after decoding): it
// must never panic, must answer a forward in full, and must hold no
// counter or replica afterwards that a public check could not have made.
func FuzzPeerHandlers(f *testing.F) {
	item := &pb.CheckItem{Name: "api", Key: "user:1", Limit: 10, DurationMs: 60_000, Behavior: pb.Behavior_GLOBAL}
	rec := record(limiter.TokenBucket, "api", "user:1", algorithms.Limit{Count: 10, Period: time.Minute}, t0.UnixNano(),
		encoded(&algorithms.TokenBucket{Full: t0.UnixNano()}))
	spaced := &pb.CheckItem{Name: "api", Key: "user:1", Limit: 10, DurationMs: 60_000, MinIntervalMs: 500}
	spacing := record(limiter.Spacing, "api", "user:1", limiter.SpacingLimit(500*time.Millisecond), t0.UnixNano(),
		encoded(&algorithms.Spacing{Next: t0.Add(500 * time.Millisecond).UnixNano()}))
	for rpc, m := range []proto.Message{
		&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{item}}}, Relayed: true, Pulled: true},
		&peerpb.GlobalHitsRequest{From: "node-1", Reports: []*peerpb.GlobalReport{{Item: item, Admitted: 3, Acked: 1, Epoch: 2, Want: true}}},
		&peerpb.GlobalUpdateRequest{From: "node-1", States: []*peerpb.GlobalState{{Name: "api", Key: "user:1", Limit: 10, Remaining: 4,
			ResetTimeMs: t0.UnixMilli(), Grants: []*peerpb.GlobalGrant{{Node: "node-0", Granted: 3, Epoch: 2, Received: 1}}}}},
		&peerpb.HandOffRequest{From: "node-1", Counters: []*peerpb.CounterState{{Counter: rec}, {Counter: []byte{1, 2}}}, Done: 7},
		&peerpb.ReplicateRequest{From: "node-1", Counters: []*peerpb.CounterState{{Counter: rec}, {Counter: []byte{1, 2}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(rpc), b)
	}
	borrowing := &pb.CheckItem{Name: "api", Key: "user:1", Limit: 10, DurationMs: 60_000, Ceiling: 20,
		Parent: &pb.ParentLimit{Key: "all", Limit: 100}}
	ceiling := limiter.Counter{Name: "api", Key: "user:1", Algorithm: limiter.TokenBucket, Role: limiter.RoleCeiling,
		Limit: algorithms.Limit{Count: 20, Period: time.Minute}, Last: t0.UnixNano(), State: encoded(&algorithms.TokenBucket{Full: t0.UnixNano()})}
	ceilingRec, err := ceiling.AppendBinary(nil)
	if err != nil {
		f.Fatal(err)
	}
	// Spacings: a spaced forward, a spacing handed off; borrowing: a
	// check, forced hits, a ceiling counter. (The first byte is the RPC,
	// in the order above.)
	for _, seed := range []struct {
		rpc byte
		m   proto.Message
	}{
		{0, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{spaced, {Name: "a", Key: "k", MinIntervalMs: 9}}, All: true}}}},
		{0, &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{borrowing}}}}},
		{1, &peerpb.GlobalHitsRequest{From: "node-1", Reports: []*peerpb.GlobalReport{{Item: item, Admitted: 3, Acked: 1, Epoch: 2, Forced: 7, ForcedAcked: 2}}}},
		{3, &peerpb.HandOffRequest{From: "node-1", Counters: []*peerpb.CounterState{{Counter: spacing}}}},
		{4, &peerpb.ReplicateRequest{From: "node-1", Counters: []*peerpb.CounterState{{Counter: ceilingRec}}}},
	} {
		b, err := proto.Marshal(seed.m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed.rpc, b)
	}
	c, svcs := newFakeCluster(2)
	srv := peer.NewServer(svcs[0].Owner(), nil)
	f.Fuzz(func(t *testing.T, rpc byte, data []byte) {
		ctx := t.Context()
		switch rpc % 5 {
		case 0:
			var req peerpb.ForwardRequest
			if proto.Unmarshal(data, &req) != nil {
				return
			}
			resp, err := srv.Forward(ctx, &req)
			if err == nil && len(resp.GetResponses()) != len(req.GetRequests()) {
				t.Fatalf("%d responses to %d requests", len(resp.GetResponses()), len(req.GetRequests()))
			}
		case 1:
			var req peerpb.GlobalHitsRequest
			if proto.Unmarshal(data, &req) == nil {
				_, _ = srv.AddGlobalHits(ctx, &req)
			}
		case 2:
			var req peerpb.GlobalUpdateRequest
			if proto.Unmarshal(data, &req) == nil {
				_, _ = srv.UpdateGlobals(ctx, &req)
			}
		case 3:
			var req peerpb.HandOffRequest
			if proto.Unmarshal(data, &req) == nil {
				_, _ = srv.HandOff(ctx, &req)
			}
		case 4:
			var req peerpb.ReplicateRequest
			if proto.Unmarshal(data, &req) == nil {
				_, _ = srv.Replicate(ctx, &req)
			}
		}
		for _, s := range []*limiter.Store{svcs[0].store, c.replicas["peer-0"]} {
			for c := range s.Counters() {
				if err := checks.ValidateCounter(&c); err != nil {
					t.Fatalf("the node holds a counter (or replica) no check could make: %v", err)
				}
			}
		}
	})
}

// TestGlobalLastReportOfADepartedNode: a node shutting down leaves the
// ring before it sends its last GLOBAL report. The owner still takes it
// (charging what the node admitted, up to one share), for departedGrace;
// after that the node is a stranger, and its reports are refused.
func TestGlobalLastReportOfADepartedNode(t *testing.T) {
	now := t0
	clock := func() time.Time { return now }
	c, svcs := newFakeClusterWith(3, func(int) Config { return Config{Now: clock} })
	smaller := ring.New(c.ring.Members()[:2]...) // without node-2
	var key string
	for _, k := range c.keysOwnedBy(0, 100) {
		if o, _ := smaller.Owner(k); o.Name == "node-0" {
			key = k
			break
		}
	}
	item := globalItem(key)
	check(t, svcs[2], item) // asks node-0 for a grant
	syncRound(svcs)
	for range 5 {
		if r := check(t, svcs[2], item); r.Metadata[MetadataDecidedBy] != "" || r.Status != pb.Status_UNDER_LIMIT {
			t.Fatalf("node-2 did not admit from its grant: %v", r)
		}
	}
	c.ring = smaller // node-2 left; the others see it at once
	syncRound(svcs[:2])
	svcs[2].FlushGlobal(t.Context())
	if got := remaining(svcs[0], item); got != 900-6 {
		t.Errorf("after node-2's last report the counter has %d remaining, want %d", got, 900-6)
	}

	now = now.Add(2 * time.Minute)
	syncRound(svcs[:2])
	report := []*peerpb.GlobalReport{{Item: item, Admitted: 100, Epoch: 1 << 62}}
	if err := svcs[0].Owner().AddGlobalHits(t.Context(), "node-2", report); !errors.Is(err, global.ErrUnknownSender) {
		t.Errorf("a report from node-2 two minutes after it left: %v, want ErrUnknownSender", err)
	}
}
