package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/service"
)

// owner is an in-process node for leased clients: its checks and its
// lessee calls, counted, and cut off while down is set.
type owner struct {
	*service.Service
	leaseCalls, checks atomic.Int64
	down               atomic.Bool
}

func (o *owner) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	o.checks.Add(1)
	return o.Service.Check(ctx, req)
}

func (o *owner) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	if o.down.Load() {
		return nil, errors.New("unreachable")
	}
	o.leaseCalls.Add(1)
	return o.Service.Lease(ctx, req)
}

// startOwner starts an owner whose rounds run until the test's bubble
// ends.
func startOwner(t *testing.T) *owner {
	o := &owner{Service: service.New(service.Config{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return o
}

// unlent asks the owner what key's counter has not lent out: a GLOBAL
// check of no hits, which the owner decides less what it lent.
func unlent(t *testing.T, o *owner, l client.Limit, key string) int64 {
	t.Helper()
	item := l.Item(key, 0)
	item.Behavior = client.Global
	resp, err := o.Service.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{item}})
	if err != nil || resp.GetResponses()[0].GetError() != "" {
		t.Fatalf("probe: %v %v", resp, err)
	}
	return resp.GetResponses()[0].GetRemaining()
}

var hot = client.Limit{Name: "api", Count: 1000, Period: time.Hour, Algorithm: client.FixedWindow, Lease: true}

// TestLeasedAllowDecidesInProcess: the first check of a key goes to its
// owner and brings a grant back; the checks after it are decided in the
// process, with no call, until the grant is spent; every round reports
// them, and Close gives the rest back.
func TestLeasedAllowDecidesInProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := startOwner(t)
		c := client.Wrap(o)
		defer c.Close()
		d, err := c.Take(context.Background(), hot, "user:1", 1)
		if err != nil || !d.Allowed || d.DecidedBy != "" {
			t.Fatalf("first check: %+v %v; want admitted by the owner", d, err)
		}
		if o.leaseCalls.Load() != 1 {
			t.Fatalf("%d lease calls for the first check, want 1", o.leaseCalls.Load())
		}
		d, err = c.Take(context.Background(), hot, "user:1", 1)
		if err != nil || !d.Allowed || d.DecidedBy != client.DecidedByLease || d.Remaining <= 0 || d.Limit != 1000 {
			t.Fatalf("second check: %+v %v; want admitted from the lease", d, err)
		}
		if o.leaseCalls.Load() != 1 || o.checks.Load() != 0 {
			t.Errorf("the second check made %d calls, %d checks; want none", o.leaseCalls.Load()-1, o.checks.Load())
		}
		admitted := int64(2)
		for round := range 10 { // busy for 10 rounds: about 30 a round
			for range 30 {
				if ok, err := c.Allow(context.Background(), hot, "user:1"); err != nil {
					t.Fatal(err)
				} else if ok {
					admitted++
				}
			}
			time.Sleep(client.DefaultLeaseInterval)
			synctest.Wait()
			if calls := o.leaseCalls.Load(); calls > int64(2*(round+2)) {
				t.Fatalf("%d lease calls after %d rounds: want about one a round", calls, round+1)
			}
		}
		if admitted != 302 {
			t.Errorf("admitted %d of 302, want all: the limit is far above", admitted)
		}
		if got := unlent(t, o, hot, "user:1"); got >= 1000-admitted {
			t.Errorf("while the client holds a grant the owner has %d not lent out, want less than the %d not admitted", got, 1000-admitted)
		}
		c.Close()
		if got := unlent(t, o, hot, "user:1"); got != 1000-admitted {
			t.Errorf("after Close the owner has %d not lent out, want %d: every grant given back", got, 1000-admitted)
		}
	})
}

// TestLeaseGivenBackWhenIdle: a key without a check for a round gives its
// grant back, and its entry goes; a check after that goes to the owner
// again.
func TestLeaseGivenBackWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := startOwner(t)
		c := client.Wrap(o)
		defer c.Close()
		for range 50 {
			c.Allow(context.Background(), hot, "idle")
		}
		time.Sleep(client.DefaultLeaseInterval) // a busy round: reported, grant kept
		synctest.Wait()
		if got := unlent(t, o, hot, "idle"); got >= 950 {
			t.Fatalf("after a busy round %d not lent out, want a grant held", got)
		}
		time.Sleep(2 * client.DefaultLeaseInterval) // an idle round: given back
		synctest.Wait()
		if got := unlent(t, o, hot, "idle"); got != 950 {
			t.Errorf("after an idle round %d not lent out, want 950: the grant given back", got)
		}
		before := o.leaseCalls.Load()
		time.Sleep(3 * client.DefaultLeaseInterval)
		synctest.Wait()
		if o.leaseCalls.Load() != before {
			t.Errorf("an idle key was still reported: %d calls", o.leaseCalls.Load()-before)
		}
		if d, _ := c.Take(context.Background(), hot, "idle", 1); !d.Allowed || d.DecidedBy == client.DecidedByLease {
			t.Errorf("a check after the give-back: %+v, want decided by the owner", d)
		}
	})
}

// TestLeaseNeverOverLimitAcrossClients: clients asking far more than the
// limit, together, admit at most the limit, and all of it once they have
// given their grants back.
func TestLeaseNeverOverLimitAcrossClients(t *testing.T) {
	for _, alg := range []client.Algorithm{client.TokenBucket, client.GCRA, client.LeakyBucket, client.FixedWindow, client.SlidingWindow, client.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := startOwner(t)
				l := client.Limit{Name: "api", Count: 500, Period: time.Hour, Algorithm: alg, Lease: true}
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for range 4 {
					c := client.Wrap(o)
					for range 5 {
						wg.Go(func() {
							for range 20 {
								for range 10 {
									if ok, err := c.Allow(context.Background(), l, "shared"); err != nil {
										t.Error(err)
										return
									} else if ok {
										admitted.Add(1)
									}
								}
								time.Sleep(client.DefaultLeaseInterval / 4)
							}
						})
					}
					defer c.Close()
				}
				wg.Wait()
				if got := admitted.Load(); got > 500 {
					t.Errorf("%d admitted by 4 clients, over the limit 500", got)
				} else if got < 450 {
					t.Errorf("%d admitted of 1,000 asked, want nearly the limit 500", got)
				}
			})
		})
	}
}

// TestLeaseExpires: a client cut off from its owner stops using its grant
// three quarters of the time-to-live after it sent the call that renewed
// it, by its own clock, and checks the key as GLOBAL then.
func TestLeaseExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 200 * time.Millisecond // short, so that it runs out before a grant of two rounds' demand does
		o := &owner{Service: service.New(service.Config{Leases: global.LeaseConfig{TTL: ttl}})}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go o.Run(ctx)
		c := client.Wrap(o)
		defer c.Close()
		start := time.Now()
		for time.Since(start) < 5*client.DefaultLeaseInterval { // a check every 10ms: 10 a round
			c.Allow(context.Background(), hot, "cut")
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait() // the round at this instant has reported, and renewed the grant
		o.down.Store(true)
		renewed := time.Now()
		var lastLeased time.Duration
		for time.Since(renewed) < time.Second {
			d, err := c.Take(context.Background(), hot, "cut", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.DecidedBy == client.DecidedByLease {
				lastLeased = time.Since(renewed)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if lastLeased > ttl*3/4 || lastLeased < ttl/2 {
			t.Errorf("the last check from the lease came %v after its renewal, want within %v (and the grant not spent long before)", lastLeased, ttl*3/4)
		}
		if o.checks.Load() == 0 {
			t.Error("no GLOBAL check after the lease expired")
		}
	})
}

// TestLeaseBadLimits: limits that cannot be leased are refused in the
// process, naming Lease; one the owner refuses as invalid returns its
// error, and the key is not leased.
func TestLeaseBadLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := startOwner(t)
		c := client.Wrap(o)
		defer c.Close()
		for _, l := range []client.Limit{
			{Name: "api", Count: 10, Period: time.Minute, Lease: true, MinInterval: time.Second},
			{Name: "api", Count: 10, Period: time.Minute, Lease: true, Ceiling: 20, Parent: client.Parent{Key: "p", Count: 10}},
			{Name: "api", Count: 10, Period: time.Minute, Lease: true, Behavior: client.Local},
		} {
			if _, err := c.Take(context.Background(), l, "k", 1); !errors.Is(err, client.ErrInvalid) {
				t.Errorf("%+v: %v, want ErrInvalid", l, err)
			}
		}
		if _, err := c.Take(context.Background(), client.Limit{Name: "api", Count: 0, Period: time.Minute, Lease: true}, "k", 1); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("a limit of 0: %v, want ErrInvalid", err)
		}
	})
}

// TestLeasedAllowAllocates: a check decided from a lease allocates
// nothing.
func TestLeasedAllowAllocates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := startOwner(t)
		c := client.Wrap(o)
		defer c.Close()
		l := client.Limit{Name: "api", Count: 1_000_000_000, Period: time.Hour, Lease: true}
		for range 200 {
			c.Allow(context.Background(), l, "k")
		}
		time.Sleep(client.DefaultLeaseInterval) // a round: the grant sized by demand
		synctest.Wait()
		ctx := context.Background()
		if n := testing.AllocsPerRun(100, func() { c.Allow(ctx, l, "k") }); n != 0 {
			t.Errorf("a leased Allow allocates %v times, want 0", n)
		}
	})
}
