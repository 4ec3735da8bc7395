package api

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/service"
)

// Checker is what the faces need of the service.
type Checker interface {
	Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error)
}

// Member is one row of GET /v1/members.
type Member struct {
	Name       string  `json:"name"`
	GossipAddr string  `json:"gossip_addr"`
	GRPCAddr   string  `json:"grpc_addr"`
	PeerAddr   string  `json:"peer_addr"`
	HTTPAddr   string  `json:"http_addr,omitempty"` // where its metrics are; empty for a node too old to gossip it
	State      string  `json:"state"`
	Share      float64 `json:"share"` // fraction of the ring this member owns
	Self       bool    `json:"self,omitempty"`
	// Admission, for an alive member left out of the ring, says why: "not
	// admitted: <reason>", or "not admitted, retrying ..." while its peer
	// port does not answer the check.
	Admission string `json:"admission,omitempty"`
}

// Config configures the faces. Checker is required; the rest have
// documented nil defaults.
type Config struct {
	Checker Checker
	// Ready reports whether the node may take traffic (GET /readyz: 200 or
	// 503), with one line saying why not, or a warning while ready (""
	// when there is nothing to say), which /readyz answers; nil means
	// always ready.
	Ready func() (ready bool, why string)
	// ReadyNote, if not empty, is a line GET /readyz adds to its body while
	// ready (the status stays 200): a warning for whoever checks on the
	// node, such as a cluster that runs without authentication.
	ReadyNote string
	// Members lists the cluster for GET /v1/members; nil means the route
	// answers an empty list.
	Members func() []Member
	// Ring returns the ring this node routes checks by, for the Members
	// RPC and RingHeader; nil means an empty ring, so that clients send
	// checks anywhere and the node decides them.
	Ring func() *ring.Ring
	// Registerer receives the faces' metrics and Gatherer serves
	// GET /metrics; nil means no metrics.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Admit, if not nil, wraps the POST /v1/check and POST /v1/settle
	// handlers, e.g. to bound the requests in flight (admit.Gate.HTTP).
	// The probes, /metrics and /v1/members are not wrapped, so that they
	// answer under load.
	Admit func(http.Handler) http.Handler
	// Leases, if not nil, answers RateLimiter/Lease (package lease's
	// Node); nil means the RPC answers Unimplemented.
	Leases Leaser
	// Settler, if not nil, answers RateLimiter/Settle and POST /v1/settle
	// (package service's Service); nil means they answer Unimplemented
	// (HTTP 501).
	Settler Settler
	// AdmitMessage, if not nil, admits each request of a CheckStream, of
	// size bytes encoded (e.g. admit.Gate.Message): it returns what to
	// call once the request is answered, or the error to refuse it with.
	AdmitMessage func(size int64) (done func(), err error)
	// StreamSendTimeout and StreamIdleTimeout end a CheckStream whose
	// client does not read its answers, or sends no requests, and
	// StreamEnded is told of each (see mux.Server's SendTimeout,
	// IdleTimeout and Ended); zero timeouts mean never, a nil StreamEnded
	// nothing. A stream's RPC context must come through mux.Stoppable for
	// a blocked send to end.
	StreamSendTimeout, StreamIdleTimeout time.Duration
	StreamEnded                          func(ctx context.Context, reason error)
	// RESPPort, if not 0, is the port of the node's RESP listener, which
	// answers RL.CHECK (see RESPCheck): a CheckStream's header names it
	// (RESPPortHeader), so that the Go client can send its checks there.
	RESPPort int
}

// Server is the gRPC and HTTP faces of one node. It is safe for
// concurrent use.
type Server struct {
	conf    Config
	latency *prometheus.HistogramVec
	ring    atomic.Pointer[ringID] // the last ring seen, with its fingerprint
	bufs    sync.Pool              // *[]byte: JSON answers are written in these
	streams mux.Server[pb.CheckStreamRequest, pb.CheckStreamResponse]
}

// New returns a Server. It starts nothing: the caller registers it on a
// grpc.Server and serves Handler.
func New(conf Config) *Server {
	s := &Server{
		conf: conf,
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ringlimit_check_duration_seconds",
			Help:    "Time to answer a check request, by interface (grpc, grpc_stream, resp_check, grpc_lease, grpc_settle, http, http_settle).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"interface"}),
	}
	s.bufs.New = func() any { return new([]byte) }
	s.streams = mux.Server[pb.CheckStreamRequest, pb.CheckStreamResponse]{Timeout: streamTimeout, Handle: s.checkMessage, Notice: notice,
		SendTimeout: conf.StreamSendTimeout, IdleTimeout: conf.StreamIdleTimeout, Ended: conf.StreamEnded}
	if conf.Registerer != nil {
		conf.Registerer.MustRegister(s.latency)
	}
	return s
}

func (s *Server) observe(iface string, start time.Time) {
	s.latency.WithLabelValues(iface).Observe(time.Since(start).Seconds())
}

// DecidedByHeader is the gRPC trailer and HTTP header that mark a response
// in which some check was not decided by its owner (value "fallback": the
// owner was unreachable, so this node used its share of the limit). The
// affected results say so in their metadata too.
const DecidedByHeader = "ringlimit-decided-by"

// decidedBy returns the first unusual decided_by of resp's results, or "".
func decidedBy(resp *pb.CheckResponse) string {
	for _, r := range resp.GetResponses() {
		if by := r.GetMetadata()[service.MetadataDecidedBy]; by != "" {
			return by
		}
	}
	return ""
}
