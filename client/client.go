// Package client is the Go client of ringlimit's gRPC API.
//
// Most callers ask one question per request and branch on the answer:
//
//	ok, err := c.Allow(ctx, perUser, "user:42")
//
// Take returns the whole Decision (remaining hits, when to retry, when the
// counter is full again); Check sends a batch of checks as the wire does.
// A check that ringlimit could not decide, or refused as invalid, is a Go
// error (wrapping ErrInvalid, ErrUnavailable or ErrInternal) and never an
// admission: Allow and Take fail closed.
//
// A Client does not care how checks travel: New talks gRPC to one node,
// Open to several, sending each check straight to its key's owner, and
// Wrap takes any Checker (an in-process service in tests); callers of
// Allow and Take do not change.
//
// A Limit with Lease is decided in this process, with no RPC, from a grant
// lent by each key's owner, which the client reports against every round
// (see Limit.Lease and docs/leases.md).
//
// Clients made by New and Open batch: concurrent checks bound for one node
// share a request, without waiting when the node is idle (see Open), and
// the requests travel as the messages of one CheckStream to each node,
// which costs the node far less than an RPC each (see WithoutStreams).
package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// Checker sends one request of checks and returns their results in order:
// the gRPC client of a node is one, and so is a *service.Service.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Client asks ringlimit whether requests may go ahead. It is safe for
// concurrent use; one Client should serve a whole process.
type Client struct {
	checker Checker
	close   func() error // nil when wrapped
	router  *router      // nil unless the client routes
	leases  *leases      // nil when the checker takes no lease calls
	// settlers returns where a reservation of a key is settled (see
	// Reserve); nil when the checker takes no settles.
	settlers func(key string) Settler
}

// New returns a client of the node at addr (host:port), or of a load
// balancer in front of several, dialled with opts. It connects lazily.
// With no options it uses plaintext, as nodes serve by default. It is
// Open with one address and WithDialOptions(opts...): it batches, and
// does not route.
func New(addr string, opts ...grpc.DialOption) (*Client, error) {
	return Open([]string{addr}, WithDialOptions(opts...))
}

// Wrap returns a client whose checks go to ch, as they are: it neither
// batches nor routes. If ch is a Leaser too, limits with Lease are leased
// from it, reported every DefaultLeaseInterval; otherwise they are checked
// as Global. If ch is a Settler, reservations are settled with it (see
// Reserve). Close does not close ch.
func Wrap(ch Checker) *Client {
	c := &Client{checker: ch}
	if l, ok := ch.(Leaser); ok {
		c.leases = newLeases(func(string) Leaser { return l }, DefaultLeaseInterval)
	}
	if st, ok := ch.(Settler); ok {
		c.settlers = func(string) Settler { return st }
	}
	return c
}

// Algorithm and Behavior are the wire's enums, so that a Limit needs no
// import of the generated package.
type (
	Algorithm = pb.Algorithm
	Behavior  = pb.Behavior
)

// The algorithms and behaviours; docs/algorithms.md and docs/cluster.md
// (Behaviours) say what each does.
const (
	TokenBucket   = pb.Algorithm_TOKEN_BUCKET
	GCRA          = pb.Algorithm_GCRA
	LeakyBucket   = pb.Algorithm_LEAKY_BUCKET
	FixedWindow   = pb.Algorithm_FIXED_WINDOW
	SlidingWindow = pb.Algorithm_SLIDING_WINDOW
	SlidingLog    = pb.Algorithm_SLIDING_LOG

	Batched   = pb.Behavior_BATCHED
	Unbatched = pb.Behavior_UNBATCHED
	Global    = pb.Behavior_GLOBAL
	Local     = pb.Behavior_LOCAL
)

// Limit is a rate limit: Count hits per Period, under Name. With a key it
// names a counter; the algorithm is part of the counter's identity, so
// changing it starts a fresh counter. The zero values of Algorithm,
// Behavior and Burst are TokenBucket, Batched and Count.
//
// MinInterval, when positive, is the least time between two admitted
// requests for a key (the wire's min_interval_ms, rounded up to the
// millisecond so that it is never shorter): a request sooner than that
// after the last admitted one is refused, with RetryAfter the wait left,
// and it is decided with the limit all or nothing. With Count and Period
// zero, Limit is a spacing alone (the answer's Limit is then 1). Not with
// Global.
//
// Ceiling, when above Count, lets a key borrow beyond Count, up to Ceiling
// hits a Period, while Parent, a limit every key that names it shares,
// has room: Count is then the key's guarantee, and a Decision says
// Borrowed when hits were admitted beyond it (see docs/checks.md: Borrowing).
// Ceiling and Parent go together; not with Global.
//
// Lease decides the limit's checks in this process, with no RPC, from a
// grant each key's owner lends the client, which reports what it admitted
// every round (see docs/leases.md): for hot keys and tight latency
// budgets. The counter is the key's Global one: across every node and
// client it never admits more than the limit, short of a process that
// crashes with hits it has not reported (at most its grant). Decisions
// made from a lease say DecidedBy DecidedByLease. Lease goes with Behavior
// Global or none, and not with MinInterval or Ceiling.
type Limit struct {
	Name        string
	Count       int64
	Period      time.Duration
	Burst       int64
	Algorithm   Algorithm
	Behavior    Behavior
	MinInterval time.Duration
	Ceiling     int64
	Parent      Parent
	Lease       bool
}

// Parent is the limit that keys with a Ceiling borrow from: Count hits
// per Period (zero: the Limit's Period) shared by every check of the
// Limit's Name that names Key. The zero Parent is none.
type Parent struct {
	Key    string
	Count  int64
	Period time.Duration
}

// Item is the check of hits of l for key, as sent on the wire. Check
// callers build batches from it.
func (l Limit) Item(key string, hits int64) *pb.CheckItem {
	one := &single{hits: hits}
	l.fill(&one.item, key, &one.hits)
	return &one.item
}

// single is a request of one check, its item and its hits, in one
// allocation rather than four: Take's request.
type single struct {
	req   pb.CheckRequest
	items [1]*pb.CheckItem
	item  pb.CheckItem
	hits  int64
}

// fill sets item, a zero CheckItem, to the check of *hits of l for key.
func (l Limit) fill(item *pb.CheckItem, key string, hits *int64) {
	item.Name, item.Key, item.Hits, item.Limit, item.DurationMs = l.Name, key, hits, l.Count, l.Period.Milliseconds()
	item.Burst, item.Algorithm, item.Behavior, item.MinIntervalMs = l.Burst, l.Algorithm, l.Behavior, ceilMillis(l.MinInterval)
	item.Ceiling = l.Ceiling
	if p := l.Parent; p != (Parent{}) {
		item.Parent = &pb.ParentLimit{Key: p.Key, Limit: p.Count, DurationMs: p.Period.Milliseconds()}
	}
}

// ceilMillis is d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d > 0 && d%time.Millisecond != 0 {
		ms++
	}
	return ms
}

// closeTimeout bounds how long Close waits for the owners to take back the
// client's grants.
const closeTimeout = 2 * time.Second

// Never is the RetryAfter of a request that can never be admitted: it asks
// for more hits than the limit holds.
const Never time.Duration = -1

// Decision is ringlimit's answer to one check. Durations and instants are
// rounded up to the millisecond, so a caller that waits that long is never
// early.
type Decision struct {
	// Allowed reports whether the hits were admitted (and charged); a
	// refused request is charged nothing.
	Allowed bool
	// Limit is the limit applied: the one asked for, or this node's share
	// of it when DecidedBy is "fallback".
	Limit int64
	// Remaining is the whole hits that could still be admitted now.
	Remaining int64
	// ResetAt is when the counter is full again.
	ResetAt time.Time
	// RetryAfter is, when refused, how long until the same request would
	// be admitted, or Never; 0 when allowed.
	RetryAfter time.Duration
	// Delay is how long to wait before proceeding (LeakyBucket only).
	Delay time.Duration
	// DecidedBy is "" when the key's owner decided, as usual, or how the
	// check was decided otherwise: DecidedByLease ("lease") when this
	// process decided it from a lease (see Limit.Lease); "failover" when the owner was
	// unreachable and the key's heir decided on its replica, with the whole
	// limit; "fallback" when the heir was unreachable too (or the check is
	// GLOBAL) and a node decided with its share of the limit.
	DecidedBy string
	// Borrowed reports hits admitted beyond the Limit's Count, from its
	// Parent's room, within its Ceiling; Remaining and ResetAt still
	// describe Count, the key's guarantee.
	Borrowed bool
}

// Errors of a single check, wrapped with the server's text (which names
// the field for ErrInvalid).
var (
	ErrInvalid     = errors.New("invalid check")
	ErrUnavailable = errors.New("check unavailable")
	ErrInternal    = errors.New("check failed")
)

// metadataDecidedBy is the result metadata key DecidedBy comes from
// (service.MetadataDecidedBy, which a test keeps in step).
const metadataDecidedBy = "decided_by"

// DecisionOf converts one result of Check. A result carrying an error
// returns it, wrapping the sentinel of its code, and a refusal.
func DecisionOf(r *pb.CheckResult) (Decision, error) {
	if r.GetError() != "" {
		sentinel := ErrInternal
		switch r.GetErrorCode() {
		case pb.ErrorCode_INVALID_ARGUMENT:
			sentinel = ErrInvalid
		case pb.ErrorCode_UNAVAILABLE:
			sentinel = ErrUnavailable
		}
		return Decision{}, fmt.Errorf("%w: %s", sentinel, r.GetError())
	}
	d := Decision{
		Allowed:    r.GetStatus() == pb.Status_UNDER_LIMIT,
		Limit:      r.GetLimit(),
		Remaining:  r.GetRemaining(),
		ResetAt:    time.UnixMilli(r.GetResetTimeMs()),
		RetryAfter: time.Duration(r.GetRetryAfterMs()) * time.Millisecond,
		Delay:      time.Duration(r.GetDelayMs()) * time.Millisecond,
		DecidedBy:  r.GetMetadata()[metadataDecidedBy],
		Borrowed:   r.GetBorrowed(),
	}
	if r.GetRetryAfterMs() < 0 {
		d.RetryAfter = Never
	}
	return d, nil
}

// Check sends one request of one or more checks, as the wire does: a check
// that could not be decided has its error in its result. Use DecisionOf
// to read each result. A client of New or Open may send the request in an
// RPC shared with other callers', and one that routes splits it by owner;
// the answers are the request's own, in order (see Open).
func (c *Client) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	return c.checker.Check(ctx, req)
}

// Take spends hits of l for key, if l admits them, and returns the
// decision; hits 0 asks without charging. An error means the check was
// not decided, and the zero Decision refuses.
func (c *Client) Take(ctx context.Context, l Limit, key string, hits int64) (Decision, error) {
	if l.Lease {
		if err := checkLeased(&l); err != nil {
			return Decision{}, fmt.Errorf("check %s: %w", l.Name, err)
		}
		if c.leases != nil {
			if d, ok, err := c.leases.take(ctx, &l, key, hits); ok {
				if err != nil {
					return Decision{}, fmt.Errorf("check %s: %w", l.Name, err)
				}
				return d, nil
			}
		}
		l.Behavior = Global // no lease for the key: the node decides it as a GLOBAL check
	}
	one := &single{hits: hits}
	l.fill(&one.item, key, &one.hits)
	one.items[0] = &one.item
	one.req.Requests = one.items[:]
	resp, err := c.checker.Check(ctx, &one.req)
	if err != nil {
		return Decision{}, fmt.Errorf("check %s: %w", l.Name, err)
	}
	if n := len(resp.GetResponses()); n != 1 {
		return Decision{}, fmt.Errorf("check %s: %w: %d results for 1 check", l.Name, ErrInternal, n)
	}
	d, err := DecisionOf(resp.GetResponses()[0])
	if err != nil {
		return Decision{}, fmt.Errorf("check %s: %w", l.Name, err)
	}
	return d, nil
}

// Allow spends one hit of l for key and reports whether it was admitted;
// on an error it reports false.
func (c *Client) Allow(ctx context.Context, l Limit, key string) (bool, error) {
	d, err := c.Take(ctx, l, key, 1)
	return d.Allowed, err
}

// Ring returns the ring the client routes checks by: nil unless it routes
// (see Open), and until it has learned the ring from a node.
func (c *Client) Ring() *ring.Ring {
	if c.router == nil {
		return nil
	}
	return c.router.view.Load().ring
}

// Close gives back every grant the client holds (waiting up to
// closeTimeout for the owners to take them), and closes the connections
// New or Open opened, ending the RPCs in flight on them; it closes nothing
// for Wrap.
func (c *Client) Close() error {
	if c.leases != nil {
		c.leases.close(closeTimeout)
	}
	if c.close == nil {
		return nil
	}
	return c.close()
}
