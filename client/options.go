package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Option configures a client made by Open.
type Option func(*options)

type options struct {
	dial       []grpc.DialOption
	cluster    bool
	refresh    time.Duration
	unbatched  bool
	unstreams  bool
	leaseEvery time.Duration
}

// WithDialOptions dials every node with opts: the seeds, and with routing
// the members learned from them, so that all are reached alike (e.g. with
// the TLS of TLS.DialOption: every node's certificate must then be valid
// for the name checked, which is the first seed's host or TLS.ServerName).
// Without it, nodes are reached in plaintext, as they serve by default.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithCluster makes a client of a single address route as one of several
// addresses does: it learns the cluster's members through the address
// (a node, or a balancer in front of the nodes) and sends each check
// straight to its key's owner. See Open.
func WithCluster() Option {
	return func(o *options) { o.cluster = true }
}

// WithRingRefresh sets how often a routing client asks for the ring while
// it is in use (DefaultRingRefresh without it). The client asks sooner
// when a node says the ring changed, so this bounds how long a change the
// nodes did not report (such as a new member that owns none of the keys
// checked) goes unseen. It must be positive.
func WithRingRefresh(every time.Duration) Option {
	return func(o *options) { o.refresh = every }
}

// WithoutBatching sends every request in an RPC of its own (one per
// owner, when the client routes a request of several checks), under its
// caller's context, as clients did before they batched: for callers
// whose context carries gRPC metadata the node must see, which a batch of
// several callers does not carry.
func WithoutBatching() Option {
	return func(o *options) { o.unbatched = true }
}

// WithoutStreams sends batches in Check RPCs, one each, rather than as
// the requests of a CheckStream: for a proxy between client and nodes
// that does not carry long-lived streams, or interceptors that must see
// each batch as an RPC. It costs the nodes more CPU a check.
func WithoutStreams() Option {
	return func(o *options) { o.unstreams = true }
}

// Open returns a client of the ringlimit nodes at addrs (host:port, or
// any gRPC target). It connects lazily.
//
// With one address, and no WithCluster, every check goes to that node (or
// to the balancer in front of several), which forwards each to its key's
// owner. With several, or WithCluster, the client routes: it learns the
// members and their ring from the nodes and sends each check straight to
// its key's owner, saving that hop (see docs/go.md: Routing).
//
// Either way, concurrent checks bound for one node share RPCs, unless
// WithoutBatching: a check that finds no RPC in flight to its node goes
// at once, and checks that arrive while one is are gathered into the
// next. Each caller gets its own answer, and a request with "all" set
// keeps its groups. A caller whose context ends before its check is sent
// is dropped from the batch and charged nothing; once sent, the check is
// the node's to decide, as without batching: the caller returns at once
// with the context's error, but the node may have charged it.
func Open(addrs []string, opts ...Option) (*Client, error) {
	o := options{refresh: DefaultRingRefresh, leaseEvery: DefaultLeaseInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if len(addrs) == 0 {
		return nil, errors.New("addrs: no address given")
	}
	for i, a := range addrs {
		if a == "" {
			return nil, fmt.Errorf("addrs[%d]: empty address", i)
		}
	}
	if o.refresh <= 0 {
		return nil, fmt.Errorf("ring refresh: must be positive, got %v", o.refresh)
	}
	if o.leaseEvery <= 0 {
		return nil, fmt.Errorf("lease interval: must be positive, got %v", o.leaseEvery)
	}
	// Only a plaintext client of no dial options of its own sends its
	// batches to a node's RESP port: the port would not carry what those
	// options add to every call (see node.learnRESP).
	plain := len(o.dial) == 0
	if plain {
		o.dial = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conf := nodeConfig{dial: o.dial, batching: !o.unbatched, streams: !o.unstreams, resp: plain && !o.unstreams}
	if len(addrs) == 1 && !o.cluster {
		ctx, cancel := context.WithCancel(context.Background())
		conf.base = ctx
		n, err := newNode(addrs[0], conf)
		if err != nil {
			cancel()
			return nil, err
		}
		return &Client{checker: n, close: func() error {
			cancel()
			return n.close()
		}, leases: newLeases(func(string) Leaser { return n }, o.leaseEvery), settlers: func(string) Settler { return n }}, nil
	}
	r, err := newRouter(addrs, o.refresh, conf)
	if err != nil {
		return nil, err
	}
	return &Client{checker: r, close: r.Close, router: r, leases: newLeases(r.leaseRoute, o.leaseEvery), settlers: r.settleRoute}, nil
}
