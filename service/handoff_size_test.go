package service

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// TestHandOffBoundsMatchThePeerServer: a full hand-off batch fits the
// peer server's receive limit with room for gRPC's framing.
func TestHandOffBoundsMatchThePeerServer(t *testing.T) {
	// Each record costs at most 5 bytes of framing, the request a name.
	if framed := peerpb.MaxHandOffBytes + 5*peerpb.MaxHandOffCounters + 2*peerpb.MaxNodeNameLen; framed > peer.MaxMessageBytes {
		t.Errorf("a full hand-off batch takes up to %d bytes, more than the %d the peer server receives", framed, peer.MaxMessageBytes)
	}
}

// leavingPair returns two nodes joined by a real peer.Server and
// peer.Pool over loopback: from has left the ring (as at its shutdown),
// and to, alone in it, owns every key. maxRecv, if not 0, lowers to's
// receive limit below this build's, as an older node's might be.
func leavingPair(t *testing.T, maxRecv int) (from, to *Service, fromReg *prometheus.Registry) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &fakeCluster{ring: ring.New(ring.Member{Name: "node-1", PeerAddr: lis.Addr().String()})}
	to = New(Config{Cluster: fakeMember{c, ring.Member{Name: "node-1"}}, Now: fixedClock(t0)})
	opts := peer.ServerOptions()
	if maxRecv != 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(maxRecv))
	}
	g := grpc.NewServer(opts...)
	peer.NewServer(to.Owner(), nil).Register(g)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	pool := peer.NewPool(peer.Config{Timeout: time.Minute})
	t.Cleanup(func() {
		_ = pool.Close()
		g.Stop()
		<-done
	})
	fromReg = prometheus.NewRegistry()
	from = New(Config{Cluster: fakeMember{c, ring.Member{Name: "node-0"}}, Peers: pool, Now: fixedClock(t0), Registerer: fromReg})
	return from, to, fromReg
}

// fullLogs returns n sliding-log counters, each with its limit of 10,000
// hits logged, one a millisecond: ~160 KB each encoded.
func fullLogs(t *testing.T, n int) []limiter.Counter {
	t.Helper()
	var log algorithms.SlidingLog
	for i := range int64(algorithms.MaxSlidingLogLimit) {
		log.Append(t0.Add(time.Duration(i-algorithms.MaxSlidingLogLimit+1)*time.Millisecond).UnixNano(), 1)
	}
	state, err := log.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]limiter.Counter, n)
	for i := range cs {
		cs[i] = limiter.Counter{Name: "api", Key: fmt.Sprint("user-", i), Algorithm: limiter.SlidingLog,
			Limit: algorithms.Limit{Count: algorithms.MaxSlidingLogLimit, Period: time.Hour}, Last: t0.UnixNano(), State: state}
	}
	return cs
}

// handedOver checks that to holds exactly the counters cs, state for
// state, and from none.
func handedOver(t *testing.T, from, to *Service, cs []limiter.Counter) {
	t.Helper()
	if from.store.Len() != 0 || to.store.Len() != len(cs) {
		t.Fatalf("the sender keeps %d counters, the new owner holds %d; want 0 and %d", from.store.Len(), to.store.Len(), len(cs))
	}
	want := map[string][]byte{}
	for _, c := range cs {
		want[c.Key] = c.State
	}
	for c := range to.store.Counters() {
		if !bytes.Equal(c.State, want[c.Key]) {
			t.Errorf("counter %s arrived with another state (%d bytes, want %d)", c.Key, len(c.State), len(want[c.Key]))
		}
	}
}

// TestHandOffFullSlidingLogs: a node shutting down hands 230 full sliding
// logs (~37 MB in all) to their new owner over real gRPC, and every one
// arrives. Batched by count alone, they made one RPC of 37 MB, which the
// owner refused, and 230 of 230 were lost.
func TestHandOffFullSlidingLogs(t *testing.T) {
	from, to, reg := leavingPair(t, 0)
	handOffLogs(t, from, to, 230)
	if got := metricSum(t, reg, "ringlimit_handoff_pending_counters"); got != 0 {
		t.Errorf("pending counters = %v after a complete hand-off, want 0", got)
	}
}

// TestHandOffSplitsRefusedBatches: an owner whose receive limit is smaller
// than a batch (an older node) refuses it with RESOURCE_EXHAUSTED; the
// sender splits it in half until each part fits, and every counter
// arrives.
func TestHandOffSplitsRefusedBatches(t *testing.T) {
	from, to, _ := leavingPair(t, 400<<10) // two full logs fit, a batch holds six
	handOffLogs(t, from, to, 20)
}

// handOffLogs gives from n full sliding logs, has it hand off everything
// within a minute, and checks that every one arrived at to as it left.
func handOffLogs(t *testing.T, from, to *Service, n int) {
	t.Helper()
	cs := fullLogs(t, n)
	from.store.Restore(cs)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if sent, left := from.HandOffAll(ctx); sent != len(cs) || left != 0 {
		t.Errorf("HandOffAll = %d sent, %d left; want %d, 0", sent, left, len(cs))
	}
	handedOver(t, from, to, cs)
}

// TestHandOffAllWaitsForTheOwner: at shutdown, an owner that does not
// answer at first is tried again, with growing waits, until it takes
// every counter.
func TestHandOffAllWaitsForTheOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, svcs := newFakeCluster(2)
		c.down["peer-0"] = true
		tries := 0
		c.onDown = func(string) {
			if tries++; tries == 3 {
				delete(c.down, "peer-0")
			}
		}
		c.spend(svcs[1], 0, 30)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		start := time.Now()
		if sent, left := svcs[1].HandOffAll(ctx); sent != 30 || left != 0 {
			t.Errorf("HandOffAll = %d sent, %d left; want 30, 0", sent, left)
		}
		if took := time.Since(start); took != 50*time.Millisecond+100*time.Millisecond+200*time.Millisecond {
			t.Errorf("HandOffAll took %v, want three waits of 50, 100 and 200ms", took)
		}
	})
}

// TestHandOffAllReportsWhatIsLeft: an owner that never answers keeps
// shutdown's hand-off trying until its deadline, and then the node says
// how many counters it still holds, in a metric as in its log.
func TestHandOffAllReportsWhatIsLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c, svcs := newFakeClusterWith(2, func(i int) Config {
			if i == 1 {
				return Config{Registerer: reg}
			}
			return Config{}
		})
		c.down["peer-0"] = true
		c.spend(svcs[1], 0, 30)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		start := time.Now()
		if sent, left := svcs[1].HandOffAll(ctx); sent != 0 || left != 30 {
			t.Errorf("HandOffAll = %d sent, %d left; want 0, 30", sent, left)
		}
		if took := time.Since(start); took != 30*time.Second {
			t.Errorf("HandOffAll gave up after %v, want at its deadline, 30s", took)
		}
		if got := metricSum(t, reg, "ringlimit_handoff_pending_counters"); got != 30 {
			t.Errorf("pending counters = %v, want 30", got)
		}
	})
}

// TestHandOffAllLastNode: the last node of a cluster has no one to hand
// its counters to, and no one needs them: nothing is reported left.
func TestHandOffAllLastNode(t *testing.T) {
	c, svcs := newFakeCluster(1)
	check(t, svcs[0], &pb.CheckItem{Name: "api", Key: "k", Limit: 10, DurationMs: 60_000})
	c.ring = ring.New()
	if sent, left := svcs[0].HandOffAll(t.Context()); sent != 0 || left != 0 {
		t.Errorf("HandOffAll on the last node = %d sent, %d left; want 0, 0", sent, left)
	}
}
