// Package ring places keys on members with a consistent-hash ring.
//
// A Ring is an immutable snapshot built from a set of members. The cluster
// rebuilds it on every membership change and publishes the new snapshot;
// readers call Owner with no lock. Two rings built from the same members
// agree on every key's owner, whichever node built them and in whatever
// order the members were given, because New sorts the members by name and
// the hash has no seed.
//
// The placement is that of github.com/buraksezer/consistent (consistent
// hashing with bounded loads), which earlier releases called, so that
// nodes of every release agree on owners: keys hash with xxhash into one
// of PartitionCount partitions, and each partition is owned by one
// member. New works out the owner of every partition once, as consistent
// does (see New), and keeps them in a table, so Owner is a hash, a modulo
// and a slice index: no lock, no allocation. Tests hold the table to
// consistent's LocateKey.
package ring

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// The ring's shape. Every node must use the same values, or nodes would
// disagree about owners; they are constants for that reason.
// PartitionCount is a prime well above the largest cluster planned for
// (50 nodes), so that each member owns 150 or more partitions;
// ReplicationFactor, the virtual nodes a member, makes natural shares even
// enough that the bounded load cap (Load) rarely binds, so a join moves
// at most about 1.3x the ideal 1/(N+1) of the keys (see TestMovement), at
// the price of about 2 ms a ring build of 33 members, paid on
// membership changes only (BenchmarkNew).
// See docs/design-cluster.md, "Membership and the ring".
const (
	PartitionCount    = 7919
	ReplicationFactor = 200
	Load              = 1.25
)

// Member is one node of the cluster as the ring sees it. It is a plain
// value: copy it freely.
type Member struct {
	Name     string // unique node name; the ring hashes it
	PeerAddr string // host:port of the node's peer gRPC listener
	GRPCAddr string // host:port of the node's client gRPC listener
	// Boot tells the node's processes apart: one started again under the
	// same name (after a crash) has another, and its counters are not
	// where it left them. Empty for a node that does not say.
	Boot string
}

// Ring is an immutable snapshot of the consistent-hash ring. It is safe for
// concurrent use. The zero value and a nil *Ring are empty rings: Owner
// reports no owner.
type Ring struct {
	members []Member // sorted by Name, unique names
	owners  []int32  // partition ID -> index into members; nil when empty
}

// New builds a ring over members. Members are sorted by Name first, so the
// result does not depend on their order; when two members share a Name, the
// one that sorts first by PeerAddr and then GRPCAddr is kept. New with no
// members returns an empty ring. New does not keep members.
func New(members ...Member) *Ring {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int {
		return cmp.Or(
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.PeerAddr, b.PeerAddr),
			cmp.Compare(a.GRPCAddr, b.GRPCAddr),
		)
	})
	ms = slices.CompactFunc(ms, func(a, b Member) bool { return a.Name == b.Name })
	r := &Ring{members: ms}
	if len(ms) == 0 {
		// consistent.New panics on an empty, non-nil member slice.
		return r
	}

	r.owners = owners(ms)
	return r
}

// Owner returns the member that owns key. It reports false when the ring is
// empty. Owner does not allocate.
func (r *Ring) Owner(key string) (Member, bool) {
	if r == nil || len(r.owners) == 0 {
		return Member{}, false
	}
	return r.members[r.owners[Partition(key)]], true
}

// Partition returns the partition key hashes to, 0 to PartitionCount-1:
// the same for every ring, so it names the set of keys that always move
// together when the ring changes. It does not allocate.
func Partition(key string) int {
	// The same partition as consistent's FindPartitionID, without the
	// []byte(key) conversion that makes LocateKey allocate.
	return int(xxhash.Sum64String(key) % PartitionCount)
}

// PartitionOwner returns the member that owns partition p, which must be
// in [0, PartitionCount). It reports false when the ring is empty.
func (r *Ring) PartitionOwner(p int) (Member, bool) {
	if r == nil || len(r.owners) == 0 {
		return Member{}, false
	}
	return r.members[r.owners[p]], true
}

// ID identifies the ring by its members' names, which alone decide every
// key's owner: two rings with the same ID place every key alike, whichever
// node built them and whatever addresses the members have. Nodes exchange
// it to say which ring they acted on. The empty ring's ID is 0.
func (r *Ring) ID() uint64 {
	if r == nil || len(r.members) == 0 {
		return 0
	}
	d := xxhash.New()
	var n [8]byte
	for _, m := range r.members {
		binary.LittleEndian.PutUint64(n[:], uint64(len(m.Name))) // length first: names are unambiguous whatever they hold
		d.Write(n[:])
		d.WriteString(m.Name)
	}
	return d.Sum64()
}

// Without returns the ring of r's members but the one named name, e.g. the
// ring a leaving node hands its counters over by. It builds a new ring, so
// it costs as much as New.
func (r *Ring) Without(name string) *Ring {
	return New(slices.DeleteFunc(r.Members(), func(m Member) bool { return m.Name == name })...)
}

// Heirs finds who would inherit a member's keys: a key's heir is its
// owner in the ring without the key's owner, the member that takes the key
// over should its owner leave the ring. It keeps the rings without one
// member each (or a set: WithoutAll), of the latest ring asked about, so
// that a ring is built once per ring and members left out, not per key. The zero value is ready to
// use; it is safe for concurrent use.
type Heirs struct {
	mu      sync.Mutex
	base    *Ring
	without map[string]*Ring // rings of base without the member named by the key
}

// Without returns r.Without(name), built once while r is the latest ring
// asked about.
func (h *Heirs) Without(r *Ring, name string) *Ring {
	return h.WithoutAll(r, []string{name})
}

// WithoutAll returns r without every member named in names, which must be
// sorted and without repeats: the ring a key's checks go by when those
// members cannot be reached. Like Without it is built once while r is the
// latest ring asked about (Without(r, n) and WithoutAll(r, []string{n})
// are one ring). The cache holds at most maxWithout rings: the sets a node
// asks about are the members it cannot reach, few at a time, and a set
// beyond it empties the cache rather than grow it.
func (h *Heirs) WithoutAll(r *Ring, names []string) *Ring {
	id := strings.Join(names, "\x00") // member names hold no NUL
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.base != r || (h.without[id] == nil && len(h.without) >= maxWithout) {
		h.base, h.without = r, map[string]*Ring{}
	}
	w := h.without[id]
	if w == nil {
		w = New(slices.DeleteFunc(r.Members(), func(m Member) bool { _, found := slices.BinarySearch(names, m.Name); return found })...)
		h.without[id] = w
	}
	return w
}

// maxWithout bounds the rings a Heirs keeps.
const maxWithout = 256

// Heir returns the heir of key, whose owner in r is owner: its owner in r
// without owner. It reports false when r holds no other member.
func (h *Heirs) Heir(r *Ring, owner, key string) (Member, bool) {
	return h.Without(r, owner).Owner(key)
}

// Has reports whether a member named name is in the ring.
func (r *Ring) Has(name string) bool {
	_, ok := r.Member(name)
	return ok
}

// Member returns the member named name, if it is in the ring.
func (r *Ring) Member(name string) (Member, bool) {
	if r == nil {
		return Member{}, false
	}
	i, ok := slices.BinarySearchFunc(r.members, name, func(m Member, n string) int { return cmp.Compare(m.Name, n) })
	if !ok {
		return Member{}, false
	}
	return r.members[i], true
}

// Members returns a copy of the ring's members, sorted by Name.
func (r *Ring) Members() []Member {
	if r == nil {
		return nil
	}
	return slices.Clone(r.members)
}

// Len returns the number of members.
func (r *Ring) Len() int {
	if r == nil {
		return 0
	}
	return len(r.members)
}

// Shares returns each member's fraction of the partitions, keyed by Name.
// The fractions sum to 1, or the map is empty for an empty ring. Each call
// returns a new map.
func (r *Ring) Shares() map[string]float64 {
	if r == nil {
		return map[string]float64{}
	}
	counts := make([]int, len(r.members))
	for _, i := range r.owners {
		counts[i]++
	}
	shares := make(map[string]float64, len(r.members))
	for i, m := range r.members {
		shares[m.Name] = float64(counts[i]) / PartitionCount
	}
	return shares
}

// vnode is one of a member's ReplicationFactor points on the hash circle.
type vnode struct {
	hash   uint64
	member int32 // index into the members
}

// partitionHashes are where each partition falls on the hash circle: the
// xxhash of its ID's 8 little-endian bytes, the same for every ring.
var partitionHashes = sync.OnceValue(func() []uint64 {
	hs := make([]uint64, PartitionCount)
	var b [8]byte
	for p := range hs {
		binary.LittleEndian.PutUint64(b[:], uint64(p))
		hs[p] = xxhash.Sum64(b[:])
	}
	return hs
})

// owners returns the owner of each partition among ms (sorted by name,
// unique names, at least one), by consistent's rule with PartitionCount,
// ReplicationFactor, Load and xxhash: member i's points on the circle
// are the hashes of its name followed by 0 to ReplicationFactor-1 in
// decimal; a point two members share is the one added later's (the
// members are added in order of name); each partition goes to the first
// point at or after its own hash, going round, whose member owns fewer
// than the bound, ceil(floor(PartitionCount/len(ms)) * Load), partitions
// so far, partitions taken in order of ID. consistent.New takes 15 ms
// for 33 members (a fmt.Sprintf a point, and a sort of the
// circle after each member); this takes one sort, and every node builds a
// ring at every membership change, all at once (TestOwnersAreConsistents).
func owners(ms []Member) []int32 {
	circle := make([]vnode, 0, len(ms)*ReplicationFactor)
	var key []byte
	for i, m := range ms {
		key = append(key[:0], m.Name...)
		n := len(key)
		for v := range ReplicationFactor {
			key = strconv.AppendInt(key[:n], int64(v), 10)
			circle = append(circle, vnode{xxhash.Sum64(key), int32(i)})
		}
	}
	slices.SortFunc(circle, func(a, b vnode) int { return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.member, b.member)) })
	for i := len(circle) - 2; i >= 0; i-- { // a shared point is the last member's: runs sort by member
		if circle[i].hash == circle[i+1].hash {
			circle[i].member = circle[i+1].member
		}
	}
	bound := int(math.Ceil(float64(PartitionCount/len(ms)) * Load))
	loads := make([]int, len(ms))
	out := make([]int32, PartitionCount)
	for p, h := range partitionHashes() {
		i, _ := slices.BinarySearchFunc(circle, h, func(v vnode, h uint64) int { return cmp.Compare(v.hash, h) })
		for range circle { // the bound leaves room: every member's points are on the circle
			if i == len(circle) {
				i = 0
			}
			if m := circle[i].member; loads[m] < bound {
				out[p] = m
				loads[m]++
				break
			}
			i++
		}
	}
	return out
}
