package handoff

import (
	"context"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// delivering is Peers that hands counters to the Node of their address,
// unless it is down.
type delivering struct {
	peers
	nodes map[string]*Node
}

func (d *delivering) HandOff(ctx context.Context, addr, from string, counters []*peerpb.CounterState) ([]*peerpb.Refusal, error) {
	if _, err := d.peers.HandOff(ctx, addr, from, counters); err != nil {
		return nil, err
	}
	return d.nodes[addr].Receive(from, counters), nil
}

// TestHandOffMovesReservations: a round hands a counter's reservation to
// the key's new owner with the counter, where it is settled; while the
// owner is down, both stay here, and the reservation can be settled here.
func TestHandOffMovesReservations(t *testing.T) {
	ma, mb := newMembers("a", "a", "b"), newMembers("b", "a", "b")
	d := &delivering{peers: peers{down: map[string]bool{"b": true}}, nodes: map[string]*Node{}}
	sa, sb := limiter.New(limiter.Config{}), limiter.New(limiter.Config{})
	a := New(Config{Store: sa, Cluster: ma, Peers: d, MaxClockSkew: time.Second})
	d.nodes["a"], d.nodes["b"] = a, New(Config{Store: sb, Cluster: mb, Peers: d, MaxClockSkew: time.Second})
	r := ma.Ring()
	now := time.Now()
	req := limiter.Request{Name: "llm", Key: keyOf(t, r, "b", r, "b"), Algorithm: limiter.GCRA, Hits: 6,
		Limit: algorithms.Limit{Count: 10, Period: time.Minute}, Now: now}
	_, id, err := sa.Reserve(&req, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	if sent := a.HandOff(t.Context()); sent != 0 || sa.Reservations() != 1 {
		t.Fatalf("with b down: handed off %d, %d reservations here; want 0 and 1 kept", sent, sa.Reservations())
	}
	d.down["b"] = false
	if sent := a.HandOff(t.Context()); sent != 1 || sa.Reservations() != 0 || sb.Reservations() != 1 {
		t.Fatalf("handed off %d; reservations: a %d, b %d; want 1 moved to b", sent, sa.Reservations(), sb.Reservations())
	}
	got, err := sb.Settle(&limiter.Settlement{ID: id, Name: "llm", Key: req.Key, Cost: 2, Now: now})
	if err != nil || got.GivenBack != 4 || got.Decision.Remaining != 8 {
		t.Errorf("settle at b: %+v, %v; want 4 given back, 8 remaining", got, err)
	}
}
