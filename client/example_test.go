package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/service"
)

// perUser is the limit the examples check: 2 requests a minute per user.
var perUser = client.Limit{Name: "api", Count: 2, Period: time.Minute}

func ExampleClient_Allow() {
	// A real program talks to a node: c, err := client.New("localhost:8081").
	// The example runs a one-node service in process instead.
	c := client.Wrap(service.New(service.Config{}))
	defer c.Close()
	for range 3 {
		ok, err := c.Allow(context.Background(), perUser, "user:42")
		if err != nil {
			fmt.Println("error:", err) // refused: a check that was not decided never admits
			continue
		}
		fmt.Println(ok)
	}
	// Output:
	// true
	// true
	// false
}

func ExampleClient_Take() {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := client.Wrap(service.New(service.Config{Now: func() time.Time { return t0 }}))
	for range 3 {
		d, err := c.Take(context.Background(), perUser, "user:42", 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		if !d.Allowed {
			fmt.Printf("refused: retry in %v\n", d.RetryAfter)
			continue
		}
		fmt.Printf("allowed: %d of %d left, full again in %v\n", d.Remaining, d.Limit, d.ResetAt.Sub(t0))
	}
	// Output:
	// allowed: 1 of 2 left, full again in 30s
	// allowed: 0 of 2 left, full again in 1m0s
	// refused: retry in 30s
}

// A Limit with a MinInterval also spaces a key's requests: one sooner
// than that after the last admitted one is refused, with the wait left.
func ExampleLimit_minInterval() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := client.Wrap(service.New(service.Config{Now: func() time.Time { return now }}))
	spaced := client.Limit{Name: "api", Count: 100, Period: time.Minute, MinInterval: time.Second}
	for _, at := range []time.Duration{0, 400 * time.Millisecond, time.Second} {
		now = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC).Add(at)
		d, err := c.Take(context.Background(), spaced, "user:42", 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("%v: allowed %v, %d of %d left, retry in %v\n", at, d.Allowed, d.Remaining, d.Limit, d.RetryAfter)
	}
	// Output:
	// 0s: allowed true, 99 of 100 left, retry in 0s
	// 400ms: allowed false, 99 of 100 left, retry in 600ms
	// 1s: allowed true, 99 of 100 left, retry in 0s
}

// A Limit with a Ceiling and a Parent guarantees each key Count and lets
// it borrow up to Ceiling while the parent, shared by every key, has room:
// one tenant alone may use what the others leave, and the others still
// get their guarantee when they come.
func ExampleLimit_ceiling() {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := client.Wrap(service.New(service.Config{Now: func() time.Time { return t0 }}))
	tenant := client.Limit{Name: "api", Count: 2, Period: time.Minute, Algorithm: client.FixedWindow,
		Ceiling: 4, Parent: client.Parent{Key: "all", Count: 5}}
	for _, key := range []string{"acme", "acme", "acme", "acme", "acme", "globex", "globex", "globex"} {
		d, err := c.Take(context.Background(), tenant, key, 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("%s: allowed %v, borrowed %v\n", key, d.Allowed, d.Borrowed)
	}
	// Output:
	// acme: allowed true, borrowed false
	// acme: allowed true, borrowed false
	// acme: allowed true, borrowed true
	// acme: allowed true, borrowed true
	// acme: allowed false, borrowed false
	// globex: allowed true, borrowed false
	// globex: allowed true, borrowed false
	// globex: allowed false, borrowed false
}

func ExampleErrInvalid() {
	c := client.Wrap(service.New(service.Config{}))
	_, err := c.Take(context.Background(), perUser, "", 1)
	fmt.Println(errors.Is(err, client.ErrInvalid))
	fmt.Println(err)
	// Output:
	// true
	// check api: invalid check: key: must not be empty
}

// A client of several nodes sends each check straight to its key's owner,
// saving the hop through a node that would forward it. It learns the
// members and their ring from the nodes, and follows the ring as it
// changes. (Not run: it needs a cluster.)
func ExampleOpen() {
	c, err := client.Open([]string{"ringlimit-0:8081", "ringlimit-1:8081", "ringlimit-2:8081"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ok, err := c.Allow(context.Background(), perUser, "user:42")
	fmt.Println(ok, err)
}

// Behind a single address, such as a Kubernetes Service, WithCluster makes
// the client learn the members through it and route to them directly.
// Every node is then dialled with the options given: over TLS, each node's
// certificate must be valid for the name checked, here the Service's.
func ExampleWithCluster() {
	tls, err := client.TLS{CA: "/etc/ringlimit/ca.crt"}.DialOption("ringlimit:8081")
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := client.Open([]string{"ringlimit:8081"}, client.WithCluster(), client.WithDialOptions(tls))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	d, err := c.Take(context.Background(), perUser, "user:42", 1)
	fmt.Println(d.Allowed, err)
}

// A Limit with Lease is decided in this process: the first check of a key
// goes to its owner and brings a grant back, and the checks after it are
// decided from the grant, with no call, while it lasts.
func ExampleLimit_lease() {
	c := client.Wrap(service.New(service.Config{})) // a real program: client.New("localhost:8081")
	defer c.Close()
	hot := client.Limit{Name: "api", Count: 1000, Period: time.Second, Lease: true}
	for range 3 {
		d, err := c.Take(context.Background(), hot, "tenant:7", 1)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("allowed %v, decided by %q\n", d.Allowed, d.DecidedBy)
	}
	// Output:
	// allowed true, decided by ""
	// allowed true, decided by "lease"
	// allowed true, decided by "lease"
}

// A Reservation holds an estimate while work whose cost is known only
// afterwards runs (a language model's tokens), then charges what was
// really spent and gives the rest back at once.
func ExampleClient_Reserve() {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := client.Wrap(service.New(service.Config{Now: func() time.Time { return t0 }}))
	ctx := context.Background()
	tokens := client.Limit{Name: "llm_tokens", Count: 20_000, Period: time.Minute}

	r, err := c.Reserve(ctx, tokens, "tenant:acme", 1000, time.Minute)
	if err != nil || !r.Allowed {
		fmt.Println("refused:", err)
		return
	}
	defer r.Release(ctx) // gives everything back if the work fails before Settle
	fmt.Printf("reserved 1000: %d left\n", r.Remaining)

	spent := int64(420) // what the work reports when it ends
	s, err := r.Settle(ctx, spent)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Printf("settled for %d: %d given back, %d left\n", spent, s.GivenBack, s.Remaining)
	// Output:
	// reserved 1000: 19000 left
	// settled for 420: 580 given back, 19580 left
}
