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
	// merging are the nodes a join's state brings as alive that are not
	// recorded alive yet, since mergeAt (see NotifyMerge); nil when none.
	merging map[string]bool
	mergeAt time.Time
	// self and boot are this process's name and boot id; returned are the
	// other nodes a join's state listed as alive when that state also
	// listed this name under another boot id (see NotifyMerge), nil when
	// no state did.
	self, boot string
	returned   map[string]bool
}

// mergeHold bounds how long a join's merge holds the ring back (see
// NotifyMerge): memberlist merges a state in microseconds, so a node it
// brings that is not recorded by then never will be from that merge (this
// node knows it as dead with a newer incarnation, say). It also bounds
// what a forged join can delay the ring by.
const mergeHold = 500 * time.Millisecond

// maxMergeNames bounds the nodes one merge may hold the ring for: a state
// listing more does not hold it (memberlist bounds a state's bytes, not its
// nodes).
const maxMergeNames = 4096

func newEvents(self, boot string) *events {
	return &events{changed: make(chan struct{}, 1), nodes: make(map[string]node), self: self, boot: boot}
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
	old, known := e.nodes[c.name]
	if known && old.alive == c.alive {
		c.change = old.change
	} else {
		c.change = time.Now()
	}
	if known && old.alive && !alive {
		time.AfterFunc(FailGrace, e.signal) // a rebuild then drops it from the ring (see FailGrace)
	}
	e.nodes[c.name] = c
	if alive && e.merging != nil {
		delete(e.merging, c.name)
	}
	e.mu.Unlock()
	e.signal()
}

// signal tells the Run loop that something changed, without waiting.
func (e *events) signal() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// NotifyMerge is the memberlist MergeDelegate, called when a join's
// push/pull (this node's, or another's to this one) is about to merge the
// other side's state, with every node that side knows. memberlist then
// reports them one call at a time, and the Run loop, rebuilding the ring
// between two calls, would publish a ring of some of them: a node joining
// a cluster of 32 saw a ring of 14 members first, owned many keys in it,
// and took its own keys in the full ring for ones it already held, so it
// waited for none of their counters (package handoff takes the ring
// before as where counters are). So the nodes the state brings as alive
// that are not recorded alive yet hold the ring back until they are, or
// mergeHold has passed since the first of them (see snapshot). It never
// refuses a merge.
func (e *events) NotifyMerge(peers []*memberlist.Node) error {
	if len(peers) > maxMergeNames {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.noteReturn(peers)
	for _, p := range peers {
		if p.State != memberlist.StateAlive {
			continue // merged as suspect or dead: never a new member of the ring
		}
		if n, ok := e.nodes[p.Name]; ok && n.alive {
			continue
		}
		if e.merging == nil {
			e.merging, e.mergeAt = map[string]bool{}, time.Now()
			time.AfterFunc(mergeHold, e.signal) // a rebuild then publishes what is held, whatever came
		}
		e.merging[p.Name] = true
	}
	return nil
}

// noteReturn records, when a join's state lists this node's name under
// another process's boot id (alive, suspect, dead or left: memberlist
// keeps a crashed or departed node for a while), that this process took
// over a name the cluster knew, and the nodes that state lists as alive:
// the members that may hold the counters, or replicas, of its keys (see
// Cluster.Returning). Called with e.mu held.
func (e *events) noteReturn(peers []*memberlist.Node) {
	known := false
	for _, p := range peers {
		if p.Name != e.self {
			continue
		}
		if m, err := decodeMeta(p.Meta); err == nil && m.Boot != "" && m.Boot != e.boot {
			known = true
		}
	}
	if !known {
		return
	}
	if e.returned == nil {
		e.returned = map[string]bool{}
	}
	for _, p := range peers {
		if p.State == memberlist.StateAlive && p.Name != e.self {
			e.returned[p.Name] = true
		}
	}
}

// returnedTo returns the names noteReturn recorded, sorted, or nil.
func (e *events) returnedTo() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.returned == nil {
		return nil
	}
	names := make([]string, 0, len(e.returned))
	for name := range e.returned {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// merged ends the hold of this node's join's merge: the join has
// returned, so memberlist has reported every node the join brought that
// it took (see NotifyMerge).
func (e *events) merged() {
	e.mu.Lock()
	e.merging = nil
	e.mu.Unlock()
}

// snapshot returns the known nodes sorted by name, and whether a join's
// merge holds the ring back (see NotifyMerge) at now. It forgets nodes
// that have been gone for longer than keepGone, so that churn of uniquely
// named nodes does not grow the map forever.
func (e *events) snapshot(now time.Time, keepGone time.Duration) (_ []node, merging bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.merging) == 0 || now.Sub(e.mergeAt) >= mergeHold {
		e.merging = nil
	}
	out := make([]node, 0, len(e.nodes))
	for name, n := range e.nodes {
		if !n.alive && now.Sub(n.change) > keepGone {
			delete(e.nodes, name)
			continue
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.name, b.name) })
	return out, e.merging != nil
}

// get returns the node called name, if known.
func (e *events) get(name string) (node, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, ok := e.nodes[name]
	return n, ok
}

// meta is the node metadata every ringlimit node gossips, as JSON: a node
// ignores the fields it does not know, so a field can be added.
type meta struct {
	Peer string `json:"peer"`           // host:port of the peer gRPC listener
	GRPC string `json:"grpc,omitempty"` // host:port of the client gRPC listener
	HTTP string `json:"http,omitempty"` // host:port of the HTTP listener (metrics); absent from older nodes
	Boot string `json:"boot,omitempty"` // the process's boot id (ring.Member.Boot); absent from older nodes
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
