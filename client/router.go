package client

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// ringHeader is the gRPC metadata key of ring fingerprints
// (api.RingHeader, which a test keeps in step).
const ringHeader = "ringlimit-ring"

const (
	// DefaultRingRefresh is how often a routing client asks for the ring
	// while it is in use, besides when a node says the ring changed.
	DefaultRingRefresh = 10 * time.Second
	// minRefreshGap spaces the refreshes that nodes' answers call for:
	// while the nodes' rings disagree, some of them answer every check
	// with a "stale ring".
	minRefreshGap = time.Second
	// askTimeout bounds one Members RPC of a refresh.
	askTimeout = 2 * time.Second
	// retireAfter is how long a node that left the ring keeps its
	// connection, for the batches still in flight to it.
	retireAfter = time.Minute
	// maxMembers bounds the ring a client builds, far above the largest
	// cluster planned for (50 nodes): building a ring takes time and
	// memory in proportion to its members.
	maxMembers = 1000
)

// router sends each check straight to its key's owner, by a copy of the
// nodes' ring it learns from them with the Members RPC. It is safe for
// concurrent use.
//
// Where a check goes: BATCHED and UNBATCHED checks to their key's owner;
// LOCAL and GLOBAL checks, which any node decides, to the first seed, as a
// client without routing sends them (so that a LOCAL counter stays on one
// node); a request with "all" set, whole, where its first item goes (the
// node forwards what it does not own, as it does for any client). Before
// the first ring is learned, everything goes to the first seed.
//
// GLOBAL checks are answered from the grant of the node that receives
// them: sending them to their owner would put a hot key's whole load on
// one node, which is what GLOBAL is for avoiding.
//
// The ring is asked for when the client is first used, again when it is
// used and DefaultRingRefresh (or WithRingRefresh) has passed, when a
// node answers that its ring is not the client's, and when a node is
// unreachable. A stale copy is only slower: a node forwards a check it
// does not own to the owner. A check whose node is unreachable
// (UNAVAILABLE) is sent once more, to another node, which forwards it;
// should the node have decided it before its connection failed, it is
// charged twice, which errs on the side of refusing. Refreshes run in a
// goroutine started for each, one at a time; Close waits for it.
type router struct {
	conf    nodeConfig
	seeds   []*node // as given; seeds[0] is home
	refresh time.Duration
	ctx     context.Context // ends when the client closes
	cancel  context.CancelFunc

	view    atomic.Pointer[view]
	lastTry atomic.Int64 // Unix ns at which the last refresh started

	mu         sync.Mutex // guards what follows
	nodes      map[string]*node
	retired    []retired
	closed     bool
	refreshing bool
	wg         sync.WaitGroup // the refresh goroutine
}

// view is the ring a router routes by, and the node of each member. A
// view is never changed once published.
type view struct {
	ring    *ring.Ring // nil until a ring is learned
	sum     uint64     // MembersResponse.ring
	hex     string     // sum as ringHeader carries it; "" with no ring
	owners  map[string]*node
	members []*node // in name order
	learned time.Time
}

// retired is a node that left the ring, and when.
type retired struct {
	n  *node
	at time.Time
}

func newRouter(seeds []string, refresh time.Duration, conf nodeConfig) (*router, error) {
	r := &router{refresh: refresh, nodes: map[string]*node{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	conf.base, conf.router = r.ctx, r
	r.conf = conf
	for _, addr := range seeds {
		if r.nodes[addr] != nil {
			continue
		}
		n, err := newNode(addr, conf)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.nodes[addr] = n
		r.seeds = append(r.seeds, n)
	}
	r.view.Store(&view{})
	return r, nil
}

// Check sends req's checks to their owners and returns their answers.
func (r *router) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	v := r.view.Load()
	if time.Since(v.learned) >= r.refresh {
		r.ask(nil)
	}
	c := newCall(ctx, req)
	items := req.GetRequests()
	if len(items) <= 1 || req.GetAll() || v.ring == nil {
		to := r.seeds[0]
		if len(items) > 0 {
			to = r.place(v, items[0])
		}
		to.submit(c.whole(to), true)
	} else {
		for _, p := range c.split(func(it *pb.CheckItem) *node { return r.place(v, it) }) {
			p.to.submit(p, false)
		}
	}
	return c.wait()
}

// place returns the node an item goes to by v.
func (r *router) place(v *view, it *pb.CheckItem) *node {
	if b := it.GetBehavior(); b == pb.Behavior_LOCAL || b == pb.Behavior_GLOBAL {
		return r.seeds[0]
	}
	if owner, ok := v.ring.Owner(it.GetKey()); ok {
		if n := v.owners[owner.Name]; n != nil {
			return n
		}
	}
	return r.seeds[0]
}

// leaseRoute returns the node a leased key's reports go to: its owner,
// or, before a ring is learned, the first seed, which relays them.
func (r *router) leaseRoute(key string) Leaser { return r.owner(key) }

// settleRoute returns the node a reservation of key is settled at: its
// owner, which holds it, or, before a ring is learned, the first seed.
func (r *router) settleRoute(key string) Settler { return r.owner(key) }

// owner returns the node that owns key by the ring the client knows, or,
// before a ring is learned, the first seed.
func (r *router) owner(key string) *node {
	v := r.view.Load()
	if time.Since(v.learned) >= r.refresh {
		r.ask(nil)
	}
	if owner, ok := v.ring.Owner(key); ok {
		if n := v.owners[owner.Name]; n != nil {
			return n
		}
	}
	return r.seeds[0]
}

// reroute sends p, which failed with err, to another node (see other),
// when err says p's node was unreachable and p was not rerouted already;
// then the node it reaches forwards it. It asks for the ring too, which has likely
// changed. It reports whether it took p.
func (r *router) reroute(p *part, err error) bool {
	if p.retried || status.Code(err) != codes.Unavailable || p.c.ctx.Err() != nil {
		return false
	}
	r.ask(nil)
	to := r.other(p.to)
	if to == nil {
		return false
	}
	p.retried, p.to = true, to
	to.submit(p, false)
	return true
}

// other returns a node other than n: a seed, which the client was told it
// can reach (the members are reached at the addresses they advertise),
// else a member; nil if there is none.
func (r *router) other(n *node) *node {
	for _, nodes := range [][]*node{r.seeds, r.view.Load().members} {
		for _, m := range nodes {
			if m != n {
				return m
			}
		}
	}
	return nil
}

// ask starts a refresh of the ring in the background, asking hint first
// if not nil, unless one is under way or started less than
// minRefreshGap ago.
func (r *router) ask(hint *node) {
	now := time.Now()
	if now.Sub(time.Unix(0, r.lastTry.Load())) < minRefreshGap {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.refreshing {
		return
	}
	r.refreshing = true
	r.lastTry.Store(now.UnixNano())
	r.wg.Go(func() {
		r.learn(hint)
		r.mu.Lock()
		r.refreshing = false
		r.mu.Unlock()
	})
}

// learn asks nodes for their ring, hint first, then the members, then the
// seeds, and adopts the first answer.
func (r *router) learn(hint *node) {
	v := r.view.Load()
	asked := map[*node]bool{}
	for _, n := range slices.Concat([]*node{hint}, v.members, r.seeds) {
		if n == nil || asked[n] {
			continue
		}
		asked[n] = true
		ctx, cancel := context.WithTimeout(r.ctx, askTimeout)
		resp, err := n.rl.Members(ctx, &pb.MembersRequest{})
		cancel()
		if err == nil {
			r.adopt(v, resp)
			return
		}
		if r.ctx.Err() != nil {
			return
		}
	}
}

// adopt routes by the ring of resp from now on; old is the view resp
// was asked under. Members without a name or an address are left out:
// their keys go to the first seed, which forwards them. An answer of more
// than maxMembers is not believed, and changes nothing.
func (r *router) adopt(old *view, resp *pb.MembersResponse) {
	if len(resp.GetMembers()) > maxMembers {
		return
	}
	now := time.Now()
	if old.ring != nil && resp.GetRing() == old.sum {
		v := *old
		v.learned = now
		r.view.Store(&v)
		return
	}
	var ms []ring.Member
	for _, m := range resp.GetMembers() {
		if m.GetName() != "" && m.GetGrpcAddr() != "" {
			ms = append(ms, ring.Member{Name: m.GetName(), GRPCAddr: m.GetGrpcAddr()})
		}
	}
	v := &view{learned: now}
	if len(ms) > 0 {
		// Built outside the lock: a ring takes milliseconds to build.
		v.ring = ring.New(ms...)
		v.sum = resp.GetRing()
		v.hex = strconv.FormatUint(v.sum, 16)
		v.owners = make(map[string]*node, len(ms))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	for _, m := range v.ring.Members() {
		n := r.nodes[m.GRPCAddr]
		if n == nil {
			var err error
			if n, err = newNode(m.GRPCAddr, r.conf); err != nil {
				continue // an address gRPC cannot parse: its keys go to the first seed
			}
			r.nodes[m.GRPCAddr] = n
		}
		v.owners[m.Name] = n
		v.members = append(v.members, n)
	}
	r.view.Store(v)
	r.retire(v, now)
}

// retire moves the nodes that are neither seeds nor members of v to the
// retired, and closes those retired for retireAfter. The caller holds
// r.mu.
func (r *router) retire(v *view, now time.Time) {
	keep := map[*node]bool{}
	for _, nodes := range [][]*node{v.members, r.seeds} {
		for _, n := range nodes {
			keep[n] = true
		}
	}
	for addr, n := range r.nodes {
		if !keep[n] {
			delete(r.nodes, addr)
			r.retired = append(r.retired, retired{n, now})
		}
	}
	live := r.retired[:0]
	for _, old := range r.retired {
		if now.Sub(old.at) < retireAfter {
			live = append(live, old)
			continue
		}
		old.n.close()
	}
	r.retired = live
}

// Close stops refreshing and closes every connection.
func (r *router) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	for _, n := range r.nodes {
		n.conn.Close()
	}
	for _, old := range r.retired {
		old.n.close()
	}
	return nil
}
