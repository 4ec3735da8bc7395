package peer

import (
	"context"
	"crypto/x509"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// Membership is what a Guard needs from the cluster.
type Membership interface {
	// Member reports whether name is a current member (or one that left
	// moments ago, whose hand-off and last report are on the way).
	Member(name string) bool
	// Names lists the names Member reports true for. The Guard reads it
	// only for a certificate with a wildcard name, and remembers the
	// answer for the certificate.
	Names() []string
}

// GuardConfig configures a Guard. Members is required.
type GuardConfig struct {
	Members Membership
	// Certificates says the peer port runs mutual TLS, so every caller has
	// a certificate verified against the cluster CA: the name a caller
	// claims must then be one its certificate is valid for (see
	// CertificateNames). False means names cannot be authenticated, only
	// checked for membership.
	Certificates bool
	// Self is this node's own name. A caller that names itself so is
	// refused whatever its certificate (a node never calls itself), so
	// that without mutual TLS the receiving node's name, which any caller
	// knows, is no credential. Empty refuses no name for this reason.
	Self string
	// Logger receives one line per refusal; nil discards them.
	Logger *slog.Logger
	// Registerer receives ringlimit_peer_refused_total; nil means it is
	// not exported.
	Registerer prometheus.Registerer
}

// Guard checks who makes each peer call, before the Server sees it: the
// calls that carry their sender's name (AddGlobalHits, UpdateGlobals,
// HandOff, Replicate, Lease, Settle, Top, ForwardStream) are taken only
// from current members under their own names, never under the receiving
// node's. Forward carries no name: with mutual TLS it is taken only from a
// certificate naming a current member other than this node. A refused
// call fails with codes.PermissionDenied (codes.Unauthenticated without a
// certificate) and reaches no handler. What a call says, the Handler
// validates. See docs/security.md, "Members under their own names".
//
// Guard is safe for concurrent use.
type Guard struct {
	conf    GuardConfig
	log     *slog.Logger
	refused *prometheus.CounterVec

	mu    sync.Mutex
	named map[*x509.Certificate]string // a member each certificate was found to name, at most maxNamed
}

// maxNamed bounds Guard.named: a verified certificate is parsed anew on
// every handshake, and connections are long-lived, so the cache is
// emptied when it fills rather than tracking which are still in use.
const maxNamed = 1024

// The reasons of ringlimit_peer_refused_total.
const (
	refusedNoCertificate = "no_certificate" // mutual TLS without a verified certificate
	refusedWrongName     = "wrong_name"     // the claimed name is not the certificate's
	refusedNotMember     = "not_member"     // the claimed name is not a member
	refusedSelf          = "self"           // the caller claims the receiving node's own name
	refusedNoMember      = "no_member"      // the certificate of an unnamed call (Forward) names no other current member
)

// NewGuard returns a Guard configured by conf. It panics if
// conf.Registerer refuses its metric.
func NewGuard(conf GuardConfig) *Guard {
	log := conf.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringlimit_peer_refused_total",
		Help: "Peer calls refused because of who sent them, by reason: no_certificate, wrong_name, not_member, self, no_member.",
	}, []string{"reason"})
	for _, r := range []string{refusedNoCertificate, refusedWrongName, refusedNotMember, refusedSelf, refusedNoMember} {
		refused.WithLabelValues(r) // exported at 0, so that alerts see the series
	}
	if conf.Registerer != nil {
		conf.Registerer.MustRegister(refused)
	}
	return &Guard{conf: conf, log: log, refused: refused, named: make(map[*x509.Certificate]string)}
}

// Unary is the Guard as a gRPC unary server interceptor, for the peer
// server only (grpc.ChainUnaryInterceptor(g.Unary)).
func (g *Guard) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	var cert *x509.Certificate
	if g.conf.Certificates {
		if cert = verifiedLeaf(ctx); cert == nil {
			return nil, g.refuse(ctx, info.FullMethod, "", refusedNoCertificate, codes.Unauthenticated)
		}
	}
	var from string
	switch r := req.(type) {
	case *peerpb.ForwardRequest:
		if cert != nil && !g.namesMember(cert) {
			return nil, g.refuse(ctx, info.FullMethod, "", refusedNoMember, codes.PermissionDenied)
		}
		return handler(ctx, req)
	case *peerpb.GlobalHitsRequest:
		from = r.GetFrom()
	case *peerpb.HandOffRequest:
		from = r.GetFrom()
		if isDoneWord(r) {
			if err := g.checkName(ctx, info.FullMethod, cert, from); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}
	case *peerpb.GlobalUpdateRequest:
		from = r.GetFrom()
	case *peerpb.ReplicateRequest:
		from = r.GetFrom()
	case *peerpb.LeaseRelayRequest:
		from = r.GetFrom()
	case *peerpb.SettleRelayRequest:
		from = r.GetFrom()
	case *peerpb.TopRequest:
		from = r.GetFrom()
	default:
		return handler(ctx, req) // no peer method else; nothing to check
	}
	if err := g.check(ctx, info.FullMethod, cert, from); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is the Guard as a gRPC stream server interceptor, for the peer
// server only (grpc.ChainStreamInterceptor(g.Stream)): a stream is taken
// only from a member under its own name, which it gives in SenderHeader.
func (g *Guard) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	var cert *x509.Certificate
	if g.conf.Certificates {
		if cert = verifiedLeaf(ctx); cert == nil {
			return g.refuse(ctx, info.FullMethod, "", refusedNoCertificate, codes.Unauthenticated)
		}
	}
	if err := g.check(ctx, info.FullMethod, cert, Sender(ctx)); err != nil {
		return err
	}
	return handler(srv, ss)
}

// check refuses a call of method whose sender claims to be from, unless
// from is a member and, with mutual TLS, the name of cert.
func (g *Guard) check(ctx context.Context, method string, cert *x509.Certificate, from string) error {
	if err := g.checkName(ctx, method, cert, from); err != nil {
		return err
	}
	if !g.conf.Members.Member(from) {
		return g.refuse(ctx, method, from, refusedNotMember, codes.PermissionDenied)
	}
	return nil
}

// checkName refuses a call of method whose sender claims to be this node,
// or, with mutual TLS, a name cert is not valid for.
func (g *Guard) checkName(ctx context.Context, method string, cert *x509.Certificate, from string) error {
	switch {
	case from != "" && from == g.conf.Self:
		return g.refuse(ctx, method, from, refusedSelf, codes.PermissionDenied)
	case cert != nil && !CertificateNames(cert, from):
		return g.refuse(ctx, method, from, refusedWrongName, codes.PermissionDenied)
	}
	return nil
}

// isDoneWord reports whether r only says its sender's hand-off under a
// ring is done: no counters, not its last word. Such a word is taken from
// a sender this node does not count as a member yet (under its own name,
// as every call): members see a change in turn, and a new member says it
// once its round is done, which may be before this node's gossip has
// brought it. The receiver keeps the word for the ring it names, whose ID
// is a hash of its members' names, so it counts only once the sender is
// a member, and bounds the words it keeps (package handoff). Refused, a
// node of the release before says it no more (this one says it again),
// and the keys that wait for it were refused for up to 10 s.
func isDoneWord(r *peerpb.HandOffRequest) bool {
	return r.GetDone() != 0 && len(r.GetCounters()) == 0 && !r.GetLeft()
}

// namesMember reports whether cert names a current member other than this
// node: its common name or a DNS name, or, for a wildcard DNS name, any
// member's name it matches. The member found is remembered for cert, so
// that the next call on the connection costs one Member lookup.
func (g *Guard) namesMember(cert *x509.Certificate) bool {
	g.mu.Lock()
	name, ok := g.named[cert]
	g.mu.Unlock()
	if ok && g.conf.Members.Member(name) {
		return true
	}
	name = ""
	for _, n := range append([]string{cert.Subject.CommonName}, cert.DNSNames...) {
		if !strings.Contains(n, "*") && n != g.conf.Self && g.conf.Members.Member(n) && CertificateNames(cert, n) {
			name = n
			break
		}
	}
	if name == "" && slices.ContainsFunc(cert.DNSNames, func(n string) bool { return strings.Contains(n, "*") }) {
		for _, n := range g.conf.Members.Names() {
			if n != g.conf.Self && CertificateNames(cert, n) && g.conf.Members.Member(n) {
				name = n
				break
			}
		}
	}
	if name == "" {
		return false
	}
	g.mu.Lock()
	if len(g.named) >= maxNamed {
		clear(g.named)
	}
	g.named[cert] = name
	g.mu.Unlock()
	return true
}

// SenderHeader is the gRPC metadata key in which a node names itself when
// it opens a stream to a peer (ForwardStream).
const SenderHeader = "ringlimit-peer"

// Sender returns the name a peer stream's sender gives in SenderHeader,
// or "".
func Sender(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, SenderHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (g *Guard) refuse(ctx context.Context, method, from, reason string, code codes.Code) error {
	g.refused.WithLabelValues(reason).Inc()
	g.log.Warn("peer call refused", "method", method, "from", from, "reason", reason, "addr", addrOf(ctx))
	return status.Errorf(code, "peer call refused: %s (from %q)", reason, from)
}

// CertificateNames reports whether cert names node name: it is valid for
// name as a host name (a DNS SAN equal to it, or a wildcard DNS SAN such
// as *.rl-headless.ns.svc.cluster.local matching it), or its subject's
// common name is exactly name. This is the rule that binds a node's
// --node-name to its peer certificate.
func CertificateNames(cert *x509.Certificate, name string) bool {
	if name == "" {
		return false
	}
	return cert.VerifyHostname(name) == nil || cert.Subject.CommonName == name
}

// verifiedLeaf returns the certificate the TLS handshake verified for the
// caller of ctx, or nil.
func verifiedLeaf(ctx context.Context) *x509.Certificate {
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

func addrOf(ctx context.Context) string {
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
