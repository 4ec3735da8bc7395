package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// ErrUnreachable is wrapped by the errors of calls that could not reach the
// peer or got no answer in time (gRPC codes.Unavailable or
// codes.DeadlineExceeded, or a peer dropped by Retain), so that the caller
// can decide locally instead.
var ErrUnreachable = errors.New("peer unreachable")

// ErrClosed is wrapped by the errors of calls made after the Pool was
// closed, and of batched calls made or pending when Pool.Run ended.
var ErrClosed = errors.New("peer pool closed")

// maxInFlight bounds the batched Forward RPCs in flight to one peer.
const maxInFlight = 4

// Config configures a Pool. The zero value is usable: every zero field
// means its documented default.
type Config struct {
	// BatchWait is the longest a batched Forward waits for company. A
	// Forward that finds no batch in flight to its peer leaves at once;
	// one gathered behind a batch in flight leaves when that returns, when
	// BatchLimit fills its batch, or BatchWait after the batch's first
	// request arrived, whichever comes first. Zero means 500µs.
	BatchWait time.Duration
	// BatchLimit is the number of check items (not requests) at which a
	// batch is sent at once. Zero means 1000; it is capped at
	// MaxForwardItems.
	BatchLimit int
	// Timeout bounds every RPC, and a batched Forward from call to answer,
	// unless the caller's context ends sooner. Zero means DefaultTimeout.
	Timeout time.Duration
	// Registerer receives the Pool's metrics. Nil means they are not
	// exported.
	Registerer prometheus.Registerer
	// DialOptions configure every connection. Nil means plaintext
	// (insecure credentials), for a private peer network. Every
	// connection also gets a send limit of MaxMessageBytes, the peer
	// server's receive limit, and the codec wire.Codec.
	DialOptions []grpc.DialOption
	// Name is this node's member name, which batched forwards name as
	// their sender (SenderHeader) when they travel on a ForwardStream.
	// Empty means they travel as Forward RPCs.
	Name string
}

// DefaultTimeout is the forward deadline: how long a node waits for an
// owner's answer before it decides with its own share.
const DefaultTimeout = 2 * time.Second

func (c Config) withDefaults() Config {
	if c.BatchWait <= 0 {
		c.BatchWait = 500 * time.Microsecond
	}
	if c.BatchLimit <= 0 {
		c.BatchLimit = 1000
	}
	c.BatchLimit = min(c.BatchLimit, MaxForwardItems)
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.DialOptions == nil {
		c.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return c
}

// Pool holds one gRPC connection and one batcher per peer address, created
// on first use and reused. It is safe for concurrent use.
//
// Pool.Run must be running for batched Forward calls to be sent; until it
// starts they wait, bounded by their context and Config.Timeout. The other
// calls do not need Run, and keep working after Run returns until Close, so
// a node can still hand off its counters while shutting down.
type Pool struct {
	conf    Config
	metrics *metrics
	added   chan struct{} // cap 1: a peer was added, so Run has a batcher to start

	mu      sync.RWMutex
	peers   map[string]*conn
	retired map[*conn]*time.Timer // taken out by Revive and Retain, closed when their timer fires (see retire)
	running bool                  // Run was called
	ended   bool                  // Run has returned or is returning
	closed  bool                  // Close was called
}

// conn is one peer: its connection, client and batcher, and the stream
// its batches travel on.
type conn struct {
	cc     *grpc.ClientConn
	client peerpb.PeerClient
	batch  *batcher
	stream *mux.Client[peerpb.ForwardStreamRequest, peerpb.ForwardStreamResponse] // nil: Forward RPCs only
}

// close ends c's stream and closes its connection.
func (c *conn) close() error {
	if c.stream != nil {
		c.stream.Close()
	}
	return c.cc.Close()
}

// NewPool returns a Pool configured by conf. It starts nothing and dials
// nothing. It panics if conf.Registerer refuses the metrics, e.g. because
// another Pool registered them already.
func NewPool(conf Config) *Pool {
	conf = conf.withDefaults()
	return &Pool{
		conf:    conf,
		metrics: newMetrics(conf.Registerer),
		added:   make(chan struct{}, 1),
		peers:   make(map[string]*conn),
	}
}

// Run sends the batches of each peer from when the peer is first used
// (its batcher's Run), and stops them all when ctx ends. It returns ctx.Err() once every goroutine it
// started has exited; batched calls pending then fail with ErrClosed, and
// later batched calls fail at once. Run may be called only once; it does not
// close connections (see Close).
func (p *Pool) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("peer pool: Run called twice")
	}
	p.running = true
	p.mu.Unlock()

	var g errgroup.Group // batchers' Runs; each returns nil
	for {
		p.startBatchers(ctx, &g)
		select {
		case <-p.added:
		case <-ctx.Done():
			p.mu.Lock()
			p.ended = true
			for _, c := range p.peers {
				c.batch.Close(ErrClosed)
			}
			p.mu.Unlock()
			_ = g.Wait()
			return ctx.Err()
		}
	}
}

// startBatchers starts the Run of every batcher that has none yet.
func (p *Pool) startBatchers(ctx context.Context, g *errgroup.Group) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.peers {
		if b := c.batch; !b.started {
			b.started = true
			g.Go(func() error { return b.Run(ctx) })
		}
	}
}

// Close closes every connection and makes all later calls fail with
// ErrClosed; calls in flight fail. It does not wait for Run, which should be
// stopped too. Close is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	peers := p.peers
	p.peers = nil
	for _, c := range peers {
		c.batch.Close(ErrClosed)
	}
	retired := p.retired
	p.retired = nil
	for c, t := range retired {
		t.Stop()
		c.batch.Close(ErrClosed)
	}
	p.mu.Unlock()

	var errs []error
	for addr, c := range peers {
		if err := c.close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", addr, err))
		}
	}
	for c := range retired {
		_ = c.close() // its errors are of a connection no longer in use
	}
	return errors.Join(errs...)
}

// Retain drops the connections to every address not in addrs, such as
// nodes that left the cluster: calls gathered for them and not sent yet
// fail with an error wrapping ErrUnreachable, and a later call dials
// afresh. Calls already sent keep their connection until they end, and it
// is closed Config.Timeout later (retire): a node that leaves gracefully
// answers what it was sent until the others have dropped it, and closing
// its connection at the ring change lost answers to checks it had
// decided, which were then decided again at the key's new owner (charged
// twice). Retain is safe to call concurrently with everything else.
func (p *Pool) Retain(addrs []string) {
	keep := make(map[string]struct{}, len(addrs))
	for _, a := range addrs {
		keep[a] = struct{}{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.peers {
		if _, ok := keep[addr]; !ok {
			delete(p.peers, addr)
			c.batch.Close(fmt.Errorf("%w: left the cluster", ErrUnreachable))
			p.retire(c)
		}
	}
}

// peer returns the conn to addr, creating it on first use. Creating a conn
// dials nothing: gRPC connects on the first RPC.
func (p *Pool) peer(addr string) (*conn, error) {
	p.mu.RLock()
	c, ok := p.peers[addr]
	p.mu.RUnlock()
	if ok {
		return c, nil
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if c, ok := p.peers[addr]; ok {
		return c, nil
	}
	// The send limit matches the peer server's receive limit, so that an
	// oversized message fails here, with codes.ResourceExhausted, before
	// it is sent.
	var v versions // the name the node serves the Peer service under (see LegacyServiceName)
	// reconnect first: the caller's options may replace it.
	opts := append([]grpc.DialOption{reconnect}, p.conf.DialOptions...)
	opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxMessageBytes), grpc.ForceCodecV2(wire.Codec{})))
	cc, err := grpc.NewClient(addr, append(opts, v.dialOptions()...)...)
	if err != nil {
		return nil, err
	}
	c = &conn{cc: cc, client: peerpb.NewPeerClient(cc)}
	if p.conf.Name != "" {
		c.stream = mux.NewClient(mux.Config[peerpb.ForwardStreamRequest, peerpb.ForwardStreamResponse]{
			Open: func(ctx context.Context, opts ...grpc.CallOption) (peerpb.Peer_ForwardStreamClient, error) {
				return c.client.ForwardStream(metadata.AppendToOutgoingContext(ctx, SenderHeader, p.conf.Name), opts...)
			},
			Ready: func() bool { return cc.GetState() == connectivity.Ready },
			Stamp: func(r *peerpb.ForwardStreamRequest, id uint64, timeoutMs int64) { r.Id, r.TimeoutMs = id, timeoutMs },
			ID:    (*peerpb.ForwardStreamResponse).GetId,
		})
	}
	c.batch = newBatcher(p.conf.BatchWait, p.conf.BatchLimit, MaxForwardBytes, c.sendFunc(p.conf.Timeout), p.metrics.batchSize)
	if p.ended {
		c.batch.Close(ErrClosed)
	}
	p.peers[addr] = c
	select {
	case p.added <- struct{}{}:
	default: // Run has a signal pending already
	}
	return c, nil
}

// sendFunc returns the batcher's way to send a batch over c: on c's
// stream, or in a Forward RPC when there is none or it cannot carry the
// batch (not connected yet; a peer that does not serve it, or does not
// know this node yet).
func (c *conn) sendFunc(timeout time.Duration) sendFunc {
	return func(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if c.stream != nil {
			resp, err := c.stream.Call(ctx, &peerpb.ForwardStreamRequest{Requests: reqs})
			switch {
			case errors.Is(err, mux.ErrClosed):
				return nil, status.Error(codes.Canceled, "peer connection closed") // as the Forward RPC fails
			case err == nil:
				err = mux.Err(resp.GetStatus())
			}
			if !errors.Is(err, mux.ErrRefused) {
				return resp.GetResponses(), err
			}
		}
		resp, err := c.client.Forward(ctx, &peerpb.ForwardRequest{Requests: reqs})
		return resp.GetResponses(), err
	}
}
