package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// nodes returns n members named like the pods of a StatefulSet.
func nodes(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{
			Name:     fmt.Sprintf("rlnode-%d", i),
			PeerAddr: fmt.Sprintf("10.0.0.%d:8082", i+1),
			GRPCAddr: fmt.Sprintf("10.0.0.%d:8081", i+1),
		}
	}
	return ms
}

// keyFamily is a shape of keys: random keys, or look-alike keys that differ
// in a few characters, as real keys do.
type keyFamily struct {
	name string
	keys []string
}

// keyFamilies returns the first n keys of each family the balance and
// movement tests use.
func keyFamilies(n int) []keyFamily {
	fs := []keyFamily{{name: "random"}, {name: "account"}, {name: "rb_acct"}, {name: "ip+path"}}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range fs {
		fs[i].keys = make([]string, n)
	}
	// strconv, not fmt: with -race, fmt.Sprintf would take most of the time.
	for i := range n {
		fs[0].keys[i] = strconv.FormatUint(rnd.Uint64(), 36) + strconv.FormatUint(rnd.Uint64(), 36)
		fs[1].keys[i] = "account:" + strconv.Itoa(i)
		fs[2].keys[i] = "rb_acct-" + strconv.Itoa(i)
		fs[3].keys[i] = "10." + strconv.Itoa(i>>16&0xff) + "." + strconv.Itoa(i>>8&0xff) + "." + strconv.Itoa(i&0xff) + ":/api/widgets"
	}
	return fs
}

// sizes are the cluster sizes the balance and movement tests try. Building a
// 50-member ring takes about 0.1 s (0.6 s with -race), so not every size.
var sizes = []int{3, 4, 5, 7, 10, 16, 25, 50}

func TestEmpty(t *testing.T) {
	for _, r := range []*Ring{nil, {}, New(), New([]Member{}...)} {
		if m, ok := r.Owner("k"); ok {
			t.Errorf("Owner on empty ring = %v, true; want false", m)
		}
		if n := r.Len(); n != 0 {
			t.Errorf("Len = %d, want 0", n)
		}
		if ms := r.Members(); len(ms) != 0 {
			t.Errorf("Members = %v, want none", ms)
		}
		if s := r.Shares(); len(s) != 0 {
			t.Errorf("Shares = %v, want empty", s)
		}
	}
}

func TestOne(t *testing.T) {
	m := Member{Name: "a", PeerAddr: "10.0.0.1:8082", GRPCAddr: "10.0.0.1:8081"}
	r := New(m)
	for i := range 1000 {
		got, ok := r.Owner(fmt.Sprint(i))
		if !ok || got != m {
			t.Fatalf("Owner(%d) = %v, %v; want %v, true", i, got, ok, m)
		}
	}
	if s := r.Shares(); s["a"] != 1 {
		t.Errorf("Shares = %v, want a:1", s)
	}
}

func TestOrderAndDuplicates(t *testing.T) {
	ms := nodes(7)
	a := New(ms...)
	rev := slices.Clone(ms)
	slices.Reverse(rev)
	b := New(append(rev, ms[2], ms[5])...) // reversed, with duplicates
	if !slices.Equal(a.Members(), b.Members()) {
		t.Fatalf("Members differ:\n%v\n%v", a.Members(), b.Members())
	}
	for i := range 10000 {
		k := fmt.Sprint("k", i)
		ma, _ := a.Owner(k)
		mb, _ := b.Owner(k)
		if ma != mb {
			t.Fatalf("Owner(%q) = %v and %v for the same members", k, ma, mb)
		}
	}
}

func TestMembersIsACopy(t *testing.T) {
	r := New(nodes(3)...)
	ms := r.Members()
	ms[0].Name = "changed"
	if r.Members()[0].Name == "changed" {
		t.Error("Members returned the ring's own slice")
	}
}

// consistentOf returns consistent's ring of ms with the ring's shape: the
// placement every release of ringlimit agrees on.
func consistentOf(ms []Member) *consistent.Consistent {
	cm := make([]consistent.Member, len(ms))
	for i, m := range ms {
		cm[i] = name(m.Name)
	}
	return consistent.New(cm, consistent.Config{Hasher: hasher{}, PartitionCount: PartitionCount,
		ReplicationFactor: ReplicationFactor, Load: Load})
}

type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// name is a member as consistent sees it: just its name.
type name string

func (n name) String() string { return string(n) }

// TestOwnerMatchesLocateKey checks that the table in Ring gives consistent's
// own answer.
func TestOwnerMatchesLocateKey(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10} {
		r := New(nodes(n)...)
		c := consistentOf(r.Members())
		for _, f := range keyFamilies(2000) {
			for _, k := range f.keys {
				got, _ := r.Owner(k)
				want := c.LocateKey([]byte(k)).String()
				if got.Name != want {
					t.Fatalf("n=%d: Owner(%q) = %s, LocateKey = %s", n, k, got.Name, want)
				}
			}
		}
	}
}

// TestOwnersAreConsistents: every partition has the owner consistent
// gives it, for clusters of 1 to 64 members under names of every shape a
// cluster uses, including names whose points coincide ("n1" with 10 and
// "n11" with 0 hash the same bytes: the point is the later member's), so
// that nodes of this release and of those that called consistent agree
// on every key's owner.
func TestOwnersAreConsistents(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	shapes := []func(i int) string{
		func(i int) string { return "n" + strconv.Itoa(i) },
		func(i int) string { return fmt.Sprintf("rl-%d.rl-headless.default.svc.cluster.local", i) },
		func(i int) string { return fmt.Sprintf("%x", rnd.Uint64()) },
	}
	for _, shape := range shapes {
		for _, n := range []int{1, 2, 3, 5, 11, 12, 32, 33, 64} {
			ms := make([]Member, n)
			for i := range ms {
				ms[i] = Member{Name: shape(i)}
			}
			r := New(ms...)
			c := consistentOf(r.Members())
			for p := range PartitionCount {
				got, _ := r.PartitionOwner(p)
				if want := c.GetPartitionOwner(p).String(); got.Name != want {
					t.Fatalf("%d members named like %q: partition %d owned by %s, consistent says %s", n, shape(0), p, got.Name, want)
				}
			}
		}
	}
}

func TestOwnerAllocs(t *testing.T) {
	r := New(nodes(5)...)
	if n := testing.AllocsPerRun(1000, func() { r.Owner("account:42") }); n != 0 {
		t.Errorf("Owner allocates %v times per call, want 0", n)
	}
}

// TestBalance checks that no member owns more than 1.3x its fair share of
// keys. The bounded load caps partitions at 1.25x the fair share; the rest of
// the margin is sampling noise, which stays small only with enough keys per
// member (here 6000: a standard deviation of about 1.2%).
func TestBalance(t *testing.T) {
	const keysPerMember = 6000
	families := keyFamilies(slices.Max(sizes) * keysPerMember)
	for _, n := range sizes {
		r := New(nodes(n)...)
		shares := r.Shares()
		for name, s := range shares {
			if s*float64(n) > Load+0.01 {
				t.Errorf("n=%d: %s owns %.3f of partitions, %.2fx its fair share", n, name, s, s*float64(n))
			}
		}
		for _, f := range families {
			t.Run(fmt.Sprintf("%d/%s", n, f.name), func(t *testing.T) {
				keys := n * keysPerMember
				counts := make(map[string]int, n)
				for _, k := range f.keys[:keys] {
					m, _ := r.Owner(k)
					counts[m.Name]++
				}
				fair := float64(keys) / float64(n)
				busiest, most := "", 0
				for name, c := range counts {
					if c > most {
						busiest, most = name, c
					}
				}
				if ratio := float64(most) / fair; ratio > 1.3 {
					t.Errorf("%s owns %d of %d keys, %.3fx its fair share; want <= 1.3x", busiest, most, keys, ratio)
				}
				if len(counts) != n {
					t.Errorf("%d of %d members own keys", len(counts), n)
				}
			})
		}
	}
}

// TestMovement checks that adding a member to a ring of N moves about
// 1/(N+1) of the keys, and all or almost all of them to the new member. Not
// strictly all: when the new member lowers the bounded-load cap, a member
// over the new cap spills a few partitions to its neighbour. That is at most
// 0.2% of keys for these sizes; hand-off moves the counters like any other.
func TestMovement(t *testing.T) {
	const keys = 100000
	families := keyFamilies(keys)
	for _, n := range sizes {
		before := New(nodes(n)...)
		all := nodes(n + 1)
		newcomer := all[n]
		after := New(all...)
		for _, f := range families {
			t.Run(fmt.Sprintf("%d/%s", n, f.name), func(t *testing.T) {
				moved, stray := 0, 0
				for _, k := range f.keys {
					a, _ := before.Owner(k)
					b, _ := after.Owner(k)
					if a == b {
						continue
					}
					moved++
					if b != newcomer {
						stray++
					}
				}
				ideal := 1 / float64(n+1)
				frac := float64(moved) / keys
				if frac > 1.5*ideal || frac < 0.5*ideal {
					t.Errorf("%.4f of keys moved, want about %.4f (1/(N+1))", frac, ideal)
				}
				if s := float64(stray) / keys; s > 0.003 {
					t.Errorf("%.4f of keys moved between old members, want < 0.003", s)
				}
			})
		}
	}
}

func BenchmarkOwner(b *testing.B) {
	r := New(nodes(10)...)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("account:%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Owner(keys[i&1023])
		i++
	}
}

// BenchmarkNew builds rings of 3 to 50 members, and, as the baseline,
// consistent's ring of the same members, which New places alike (see
// TestOwnersAreConsistents).
func BenchmarkNew(b *testing.B) {
	for _, n := range []int{3, 10, 33, 50} {
		ms := nodes(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				New(ms...)
			}
		})
		b.Run(fmt.Sprint(n, "/consistent"), func(b *testing.B) {
			for b.Loop() {
				consistentOf(ms)
			}
		})
	}
}

func TestPartitionAndPartitionOwner(t *testing.T) {
	r := New(Member{Name: "a"}, Member{Name: "b"}, Member{Name: "c"})
	for i := range 1000 {
		key := fmt.Sprintf("k%d", i)
		p := Partition(key)
		if p < 0 || p >= PartitionCount {
			t.Fatalf("Partition(%q) = %d, outside [0, %d)", key, p, PartitionCount)
		}
		byKey, _ := r.Owner(key)
		byPartition, ok := r.PartitionOwner(p)
		if !ok || byKey != byPartition {
			t.Fatalf("key %q: Owner %v, PartitionOwner(%d) %v %v", key, byKey, p, byPartition, ok)
		}
	}
	if _, ok := New().PartitionOwner(0); ok {
		t.Error("an empty ring owns partition 0")
	}
}

func TestID(t *testing.T) {
	abc := New(Member{Name: "a", PeerAddr: "x:1"}, Member{Name: "b"}, Member{Name: "c"})
	cases := []struct {
		name string
		r    *Ring
		same bool
	}{
		{"same names, other order and addresses", New(Member{Name: "c"}, Member{Name: "a", PeerAddr: "y:2"}, Member{Name: "b"}), true},
		{"one member fewer", New(Member{Name: "a"}, Member{Name: "b"}), false},
		{"other names", New(Member{Name: "a"}, Member{Name: "b"}, Member{Name: "d"}), false},
		{"names joined otherwise", New(Member{Name: "ab"}, Member{Name: "c"}), false},
		{"Without", New(Member{Name: "a"}, Member{Name: "b"}, Member{Name: "c"}, Member{Name: "d"}).Without("d"), true},
	}
	for _, tc := range cases {
		if got := tc.r.ID() == abc.ID(); got != tc.same {
			t.Errorf("%s: same ID = %v, want %v", tc.name, got, tc.same)
		}
	}
	if New().ID() != 0 || (*Ring)(nil).ID() != 0 {
		t.Error("the empty ring's ID is not 0")
	}
}

func TestWithoutAndHas(t *testing.T) {
	r := New(Member{Name: "a"}, Member{Name: "b"}, Member{Name: "c"})
	w := r.Without("b")
	if w.Len() != 2 || w.Has("b") || !w.Has("a") || !w.Has("c") {
		t.Fatalf("Without(b) = %v", w.Members())
	}
	if !r.Has("b") || r.Len() != 3 {
		t.Fatal("Without changed the ring it was called on")
	}
	if r.Without("z").ID() != r.ID() {
		t.Error("Without a non-member changed the members")
	}
	if (*Ring)(nil).Has("a") {
		t.Error("the nil ring has a member")
	}
}
