package heal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// TestOnlyUnreachableMakesSuspect: a refusal, or a caller that left, says
// nothing about the owner's health; a timeout or an unreachable peer does.
func TestOnlyUnreachableMakesSuspect(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"answered", context.Background(), nil, false},
		{"refused", context.Background(), status.Error(codes.InvalidArgument, "too many items"), false},
		{"unreachable", context.Background(), fmt.Errorf("forward: %w", peer.ErrUnreachable), true},
		{"deadline", context.Background(), fmt.Errorf("forward: %w", context.DeadlineExceeded), true},
		{"caller left", gone, fmt.Errorf("forward: %w: %w", peer.ErrUnreachable, context.Canceled), false},
		{"other", context.Background(), errors.New("owner answered the wrong number of results"), false},
	} {
		if got := Failed(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: Failed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// revivingPeers records the addresses RingChanged asks to revive.
type revivingPeers struct {
	Peers
	revived []string
}

func (p *revivingPeers) Revive(addr string) bool {
	p.revived = append(p.revived, addr)
	return true
}

type fixedRing struct{ r *ring.Ring }

func (f fixedRing) Ring() *ring.Ring { return f.r }

// TestRingChangedRevivesTheMembers: a ring change has the connection to
// every member of the new ring try again at once if it is failing
// (peer.Pool.Revive), so that members gossip brings back after a
// partition are forwarded to as soon as they answer.
func TestRingChangedRevivesTheMembers(t *testing.T) {
	p := &revivingPeers{}
	n := New(Config{Peers: p, Cluster: fixedRing{ring.New(ring.Member{Name: "a", PeerAddr: "a:1"}, ring.Member{Name: "b", PeerAddr: "b:1"})}})
	n.RingChanged()
	slices.Sort(p.revived)
	if want := []string{"a:1", "b:1"}; !slices.Equal(p.revived, want) {
		t.Errorf("revived %v, want %v", p.revived, want)
	}
}

// changingRing is a Cluster whose ring a test replaces.
type changingRing struct{ r atomic.Pointer[ring.Ring] }

func (c *changingRing) Ring() *ring.Ring { return c.r.Load() }

// TestRingChangedEndsTheSuspicionsOfTheDropped: once the ring drops a
// member (it left, or was declared dead), this node suspects it no more:
// ringlimit_suspect_owners counts owners, and counted the dropped member
// until its suspicion lapsed, up to SuspectFor after the ring change. A
// member still in the ring stays suspect.
func TestRingChangedEndsTheSuspicionsOfTheDropped(t *testing.T) {
	a, b := ring.Member{Name: "a", PeerAddr: "a:1"}, ring.Member{Name: "b", PeerAddr: "b:1"}
	c := &changingRing{}
	c.r.Store(ring.New(a, b))
	n := New(Config{Peers: &revivingPeers{}, Cluster: c})
	n.Mark("a:1")
	n.Mark("b:1")
	if got := n.suspects.count(); got != 2 {
		t.Fatalf("before the ring change: %d suspect, want 2", got)
	}
	c.r.Store(ring.New(a))
	n.RingChanged()
	if n.Suspect("b:1") {
		t.Error("b, dropped from the ring, is still suspect")
	}
	if !n.Suspect("a:1") {
		t.Error("a, still in the ring, is no longer suspect")
	}
	if got := n.suspects.count(); got != 1 {
		t.Errorf("after the ring change: %d suspect, want 1 (a)", got)
	}
}
