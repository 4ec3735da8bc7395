package cluster

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// node is this process's copy of what memberlist knows about one node.
type node struct {
	name   string
	addr   string // gossip host:port
	ip     string // gossip IP, the node's advertise address
	meta   []byte // owned copy
	alive  bool
	change time.Time // when alive last changed, by our clock
}

// events is the memberlist EventDelegate. memberlist calls it with its node
// lock held, one call at a time, from its own goroutines.
//
// STYLE says such callbacks only signal the Run loop. These also copy the
// node into a map under a mutex held for a few map writes, because this is
// the only race-free moment to read a *memberlist.Node: memberlist.Members
// returns pointers that memberlist keeps mutating under its lock. The
// callbacks never wait on the Run loop: the signal is a non-blocking send to
// a channel of capacity 1, which coalesces bursts.
type events struct {
	changed chan struct{}

	mu    sync.Mutex
	nodes map[string]node
}

func newEvents() *events {
	return &events{changed: make(chan struct{}, 1), nodes: make(map[string]node)}
}

// The kind of callback tells the node's state: memberlist keeps a node's
// state in a field of its own that shadows Node.State, so Node.State always
// reads StateAlive.
func (e *events) NotifyJoin(n *memberlist.Node)   { e.record(n, true) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.record(n, true) }
func (e *events) NotifyLeave(n *memberlist.Node)  { e.record(n, false) }

func (e *events) record(n *memberlist.Node, alive bool) {
	c := node{
		name:  n.Name,
		addr:  n.Address(),
		ip:    n.Addr.String(),
		meta:  slices.Clone(n.Meta),
		alive: alive,
	}
	e.mu.Lock()
	if old, ok := e.nodes[c.name]; ok && old.alive == c.alive {
		c.change = old.change
	} else {
		c.change = time.Now()
	}
	e.nodes[c.name] = c
	e.mu.Unlock()

	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// snapshot returns the known nodes sorted by name. It forgets nodes that
// have been gone for longer than keepGone, so that churn of uniquely named
// nodes does not grow the map forever.
func (e *events) snapshot(now time.Time, keepGone time.Duration) []node {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]node, 0, len(e.nodes))
	for name, n := range e.nodes {
		if !n.alive && now.Sub(n.change) > keepGone {
			delete(e.nodes, name)
			continue
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.name, b.name) })
	return out
}

// get returns the node called name, if known.
func (e *events) get(name string) (node, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, ok := e.nodes[name]
	return n, ok
}

// meta is the node metadata every ringlimit node gossips, as JSON.
type meta struct {
	Peer string `json:"peer"`           // host:port of the peer gRPC listener
	GRPC string `json:"grpc,omitempty"` // host:port of the client gRPC listener
	HTTP string `json:"http,omitempty"` // host:port of the HTTP listener (metrics); absent from older nodes
}

func encodeMeta(m meta) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode node metadata: %w", err)
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("encode node metadata: %d bytes, more than the %d memberlist allows", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, fmt.Errorf("decode node metadata: %w", err)
	}
	if m.Peer == "" {
		return meta{}, fmt.Errorf("decode node metadata: no peer address")
	}
	return m, nil
}

// delegate is the memberlist Delegate. Only NodeMeta does anything: it
// gossips this node's metadata. memberlist calls it from Create and
// UpdateNode; the Run loop replaces the metadata between those calls, so it
// is held in an atomic pointer.
type delegate struct {
	meta atomic.Pointer[[]byte]
}

func (d *delegate) NodeMeta(limit int) []byte {
	p := d.meta.Load()
	if p == nil || len(*p) > limit {
		// New and Run check the size; memberlist panics on oversize metadata.
		return nil
	}
	return *p
}

func (*delegate) NotifyMsg([]byte)                           {}
func (*delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (*delegate) LocalState(join bool) []byte                { return nil }
func (*delegate) MergeRemoteState(buf []byte, join bool)     {}
