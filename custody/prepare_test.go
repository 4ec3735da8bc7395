package custody

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/strict"
)

// verdictFence is strict mode answering v for every check it judges.
type verdictFence struct{ v strict.Verdict }

func (verdictFence) On() bool { return true }
func (f verdictFence) Judge(*limiter.Request, bool, *ring.Ring, string, func(*limiter.Request) bool, time.Time) strict.Verdict {
	return f.v
}

// standIns records the owners Prepare noted a stand-in's decision for.
type standIns struct {
	noWatch
	owners []string
}

func (s *standIns) StandIn(addr string, _ time.Time) { s.owners = append(s.owners, addr) }

// TestPrepare: each check Prepare answers gets what its key needs, in one
// place: a LOCAL check nothing; a check strict mode fences is refused,
// or its counter counted spent first; a check landed here for another
// owner is decided as a stand-in's, its owner noted, after the owner's
// replica became its counter; a GLOBAL check is ready at once; and a
// client that has gone has none decided.
func TestPrepare(t *testing.T) {
	r := ring.New(nodeA, nodeB, nodeC)
	var ofA, ofB string
	for k := 0; ofA == "" || ofB == ""; k++ {
		key := fmt.Sprint("key-", k)
		switch o, _ := r.Owner(key); o.Name {
		case "a":
			ofA = key
		case "b":
			ofB = key
		}
	}
	limit := algorithms.Limit{Count: 10, Period: time.Hour}
	req := func(key string) *limiter.Request {
		return &limiter.Request{Name: "api", Key: key, Algorithm: limiter.TokenBucket, Limit: limit, Hits: 1, Now: time.Unix(0, 0)}
	}
	newCustody := func(fence Fence, watch Watch) *Custody {
		return New(Config{Store: limiter.New(limiter.Config{}), Cluster: fixedMembership{r, nodeA}, Fence: fence, Watch: watch,
			Now: func() time.Time { return time.Unix(0, 0) }})
	}
	prepare := func(c *Custody, ctx context.Context, cks ...Check) []Verdict {
		c.Prepare(ctx, r, time.Time{}, false, cks).Done()
		vs := make([]Verdict, len(cks))
		for i := range cks {
			vs[i] = cks[i].Verdict
		}
		return vs
	}

	off := strict.New(0, 0)
	c := newCustody(off, noWatch{})
	if v := prepare(c, t.Context(), Check{Req: req(ofB), Local: true})[0]; v.Kind != Ready {
		t.Errorf("LOCAL: %+v, want ready", v)
	}

	c = newCustody(verdictFence{strict.Refuse}, noWatch{})
	vs := prepare(c, t.Context(), Check{Req: req(ofA), Owned: true}, Check{Req: req(ofA)})
	if vs[0].Kind != Refuse || !errors.Is(vs[0].Err, ErrFenced) || vs[1].Kind != Ready {
		t.Errorf("fenced: %+v, and a check this node does not own: %+v; want refused (ErrFenced), ready", vs[0], vs[1])
	}

	c = newCustody(verdictFence{strict.Charge}, noWatch{})
	if v := prepare(c, t.Context(), Check{Req: req(ofA), Owned: true})[0]; v.Kind != Ready {
		t.Errorf("to be charged: %+v, want ready", v)
	}
	if d := c.store.Check(req(ofA)); d.Allowed {
		t.Errorf("the counter of a key strict mode charges: %+v, want spent", d)
	}

	watch := &standIns{}
	c = newCustody(off, watch)
	landed, own := req(ofB), req(ofA)
	vs = prepare(c, t.Context(), Check{Req: landed, Landed: true}, Check{Req: own, Landed: true})
	if vs[0].Kind != Ready || !landed.StandIn || own.StandIn || len(watch.owners) != 1 || watch.owners[0] != nodeB.PeerAddr {
		t.Errorf("landed for b, and for a: %+v, %+v, stand-in %v, %v, owners noted %v; want both ready, b's a stand-in's, b noted",
			vs[0], vs[1], landed.StandIn, own.StandIn, watch.owners)
	}

	if v := prepare(c, t.Context(), Check{Req: req(ofA), Owned: true, Global: true})[0]; v.Kind != Ready {
		t.Errorf("GLOBAL: %+v, want ready", v)
	}

	gone, cancel := context.WithCancel(t.Context())
	cancel()
	vs = prepare(c, gone, Check{Req: req(ofA)}, Check{Req: req(ofB), Local: true})
	for i, v := range vs {
		if v.Kind != Refuse || !errors.Is(v.Err, checks.ErrUnavailable) {
			t.Errorf("check %d of a client that has gone: %+v, want refused unavailable", i, v)
		}
	}
}
