package peer

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/testpki"
)

// members is a fake Membership: the names listed are members.
type members []string

func (m members) Member(name string) bool {
	for _, n := range m {
		if n == name {
			return true
		}
	}
	return false
}

func (m members) Names() []string { return m }

// guarded serves h behind a Guard over members, with mutual TLS from ca if
// it is not nil, and returns the address and the Guard's registry.
func guarded(t *testing.T, h Handler, ca *testpki.CA, m members) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g := NewGuard(GuardConfig{Members: m, Certificates: ca != nil, Registerer: reg})
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.Unary), grpc.ChainStreamInterceptor(g.Stream)}
	if ca != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsSource(t, ca, ca, "a").ServerConfig())))
	}
	return serveService(t, NewServer(h, nil), opts...), reg
}

// dialAs returns a Peer client with a certificate for name from ca, or a
// plaintext one if ca is nil.
func dialAs(t *testing.T, addr string, ca *testpki.CA, name string) peerpb.PeerClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if ca != nil {
		creds = credentials.NewTLS(tlsSource(t, ca, ca, name).ClientConfig(""))
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return peerpb.NewPeerClient(cc)
}

// refusals reads ringlimit_peer_refused_total{reason} from reg.
func refusals(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "ringlimit_peer_refused_total" && m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no ringlimit_peer_refused_total{reason=%q}", reason)
	return 0
}

// TestGuardBindsNamesToCertificates: with mutual TLS, a member with a
// cluster certificate for "b" may report, hand off and update GLOBAL state
// as b, but not as another member, and a certificate holder that is not a
// member is refused; refused calls reach no handler.
func TestGuardBindsNamesToCertificates(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	h := &fakeHandler{}
	addr, reg := guarded(t, h, ca, members{"a", "b", "c"})
	asB := dialAs(t, addr, ca, "b")

	// As itself: accepted.
	if _, err := asB.HandOff(t.Context(), &peerpb.HandOffRequest{From: "b", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}}); err != nil {
		t.Fatalf("hand-off from b as b: %v", err)
	}
	if _, err := asB.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "b", Reports: []*peerpb.GlobalReport{{Admitted: 1}}}); err != nil {
		t.Fatalf("report from b as b: %v", err)
	}
	h.mu.Lock()
	h.handedBy, h.hits = "", nil
	h.mu.Unlock()

	// As c, a member, with b's certificate: refused.
	for rpc, err := range map[string]error{
		"HandOff":       second(asB.HandOff(t.Context(), &peerpb.HandOffRequest{From: "c", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})),
		"AddGlobalHits": second(asB.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "c", Reports: []*peerpb.GlobalReport{{Admitted: 1e9}}})),
		"UpdateGlobals": second(asB.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{From: "c", States: []*peerpb.GlobalState{{Key: "c:1", Remaining: 1e9}}})),
		"Replicate":     second(asB.Replicate(t.Context(), &peerpb.ReplicateRequest{From: "c", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})),
	} {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s from c with b's certificate: %v, want PermissionDenied", rpc, err)
		}
	}
	if got := refusals(t, reg, refusedWrongName); got != 4 {
		t.Errorf("wrong_name refusals = %v, want 4", got)
	}

	// A certificate of the cluster CA for a name that is not a member.
	asX := dialAs(t, addr, ca, "x")
	if _, err := asX.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "x", Reports: []*peerpb.GlobalReport{{Admitted: 1e9}}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("report from x, not a member: %v, want PermissionDenied", err)
	}
	if got := refusals(t, reg, refusedNotMember); got != 1 {
		t.Errorf("not_member refusals = %v, want 1", got)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.handedBy != "" || h.replicaOf != "" || len(h.hits) != 0 || len(h.states) != 0 {
		t.Errorf("refused calls reached the handler: hand-off from %q, replicas from %q, %d reports, %d states", h.handedBy, h.replicaOf, len(h.hits), len(h.states))
	}
}

func second[T any](_ T, err error) error { return err }

// TestGuardWithoutTLS: without certificates a name cannot be
// authenticated, but a report, update or hand-off from a node that does not
// exist (the attack that drains any key) is still refused.
func TestGuardWithoutTLS(t *testing.T) {
	h := &fakeHandler{}
	addr, reg := guarded(t, h, nil, members{"a", "b"})
	c := dialAs(t, addr, nil, "")
	for rpc, err := range map[string]error{
		"HandOff":       second(c.HandOff(t.Context(), &peerpb.HandOffRequest{From: "ghost", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})),
		"Replicate":     second(c.Replicate(t.Context(), &peerpb.ReplicateRequest{From: "ghost", Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})),
		"AddGlobalHits": second(c.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "ghost", Reports: []*peerpb.GlobalReport{{Admitted: 1e9}}})),
		"UpdateGlobals": second(c.UpdateGlobals(t.Context(), &peerpb.GlobalUpdateRequest{States: []*peerpb.GlobalState{{Key: "a:1", Remaining: 1e9}}})),
	} {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s from a non-member: %v, want PermissionDenied", rpc, err)
		}
	}
	if got := refusals(t, reg, refusedNotMember); got != 4 {
		t.Errorf("not_member refusals = %v, want 4", got)
	}
	if _, err := c.AddGlobalHits(t.Context(), &peerpb.GlobalHitsRequest{From: "b", Reports: []*peerpb.GlobalReport{{Admitted: 1}}}); err != nil {
		t.Errorf("report from member b: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.handedBy != "" || len(h.states) != 0 || len(h.hits) != 1 || h.reportedBy != "b" {
		t.Errorf("handler saw hand-off from %q, %d states, %d reports by %q; want only b's report", h.handedBy, len(h.states), len(h.hits), h.reportedBy)
	}
}

func TestCertificateNames(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	parse := func(cn string, sans ...string) *x509.Certificate {
		c := ca.Issue(t, cn, sans...).TLS(t)
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf
	}
	shared := parse("ringlimit", "rl-0", "rl-1", "*.rl-headless.ns.svc.cluster.local")
	for _, tc := range []struct {
		cert *x509.Certificate
		name string
		want bool
	}{
		{shared, "rl-0", true},
		{shared, "rl-1", true},
		{shared, "rl-2", false},
		{shared, "rl-7.rl-headless.ns.svc.cluster.local", true},
		{shared, "a.b.rl-headless.ns.svc.cluster.local", false}, // a wildcard covers one label
		{shared, "ringlimit", true},                             // the common name, taken exactly (Go's host name rule ignores it)
		{parse("node-a"), "node-a", true},
		{parse("node-a"), "node-b", false},
		{shared, "", false},
	} {
		if got := CertificateNames(tc.cert, tc.name); got != tc.want {
			t.Errorf("CertificateNames(%v / %q, %q) = %v, want %v", tc.cert.DNSNames, tc.cert.Subject.CommonName, tc.name, got, tc.want)
		}
	}
}

// TestGuardForwardAndSelf: with mutual TLS, Forward is taken from a
// certificate naming a current member other than the receiver (by its
// name, or a wildcard matching one), and refused as no_member from any
// other certificate of the cluster CA (a stranger's, the receiver's own,
// a wildcard matching no member); and no call is taken under the
// receiver's own name, with or without TLS.
func TestGuardForwardAndSelf(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	reg := prometheus.NewRegistry()
	m := members{"a", "b.rl.ns", "c"}
	g := NewGuard(GuardConfig{Members: m, Certificates: true, Self: "a", Registerer: reg})
	addr := serveService(t, NewServer(&fakeHandler{}, nil), grpc.ChainUnaryInterceptor(g.Unary), grpc.ChainStreamInterceptor(g.Stream),
		grpc.Creds(credentials.NewTLS(tlsSource(t, ca, ca, "a").ServerConfig())))
	forward := &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{{Name: "n", Key: "k", Limit: 1, DurationMs: 1000}}}}}
	for _, tc := range []struct {
		cert string
		want codes.Code
	}{
		{"c", codes.OK},
		{"*.rl.ns", codes.OK}, // matches b.rl.ns
		{"stranger", codes.PermissionDenied},
		{"a", codes.PermissionDenied},
		{"*.other.ns", codes.PermissionDenied},
	} {
		_, err := dialAs(t, addr, ca, tc.cert).Forward(t.Context(), forward)
		if status.Code(err) != tc.want {
			t.Errorf("Forward with a certificate for %s: %v, want %v", tc.cert, err, tc.want)
		}
	}
	if got := refusals(t, reg, refusedNoMember); got != 3 {
		t.Errorf("no_member refusals = %v, want 3", got)
	}
	if _, err := dialAs(t, addr, ca, "a").HandOff(t.Context(), &peerpb.HandOffRequest{From: "a"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("HandOff as a, the receiver, with a's certificate: %v, want PermissionDenied", err)
	}
	if got := refusals(t, reg, refusedSelf); got != 1 {
		t.Errorf("self refusals = %v, want 1", got)
	}
}

// TestGuardTakesADoneWordFromANodeNotAMemberYet: a word that a node's
// hand-off under a ring is done (no counters, not its last word) is taken
// from a node this one does not count as a member yet, under its own
// name, so that the word of a new member that says it once, before this
// node's gossip has brought it, is not lost (package handoff keeps it for
// its ring). Counters, a last word, a word under another name than the
// certificate's, or under this node's own name, are refused as before.
func TestGuardTakesADoneWordFromANodeNotAMemberYet(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	h := &fakeHandler{}
	addr, reg := guarded(t, h, ca, members{"a", "b"})
	asX := dialAs(t, addr, ca, "x")
	if _, err := asX.HandOff(t.Context(), &peerpb.HandOffRequest{From: "x", Done: 7}); err != nil {
		t.Fatalf("done word from x, not a member yet: %v", err)
	}
	for what, err := range map[string]error{
		"counters":             second(asX.HandOff(t.Context(), &peerpb.HandOffRequest{From: "x", Done: 7, Counters: []*peerpb.CounterState{{Counter: []byte{1}}}})),
		"a last word":          second(asX.HandOff(t.Context(), &peerpb.HandOffRequest{From: "x", Done: 7, Left: true})),
		"another name":         second(asX.HandOff(t.Context(), &peerpb.HandOffRequest{From: "y", Done: 7})),
		"no word, no counters": second(asX.HandOff(t.Context(), &peerpb.HandOffRequest{From: "x"})),
	} {
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s from x, not a member: %v, want PermissionDenied", what, err)
		}
	}
	if got := refusals(t, reg, refusedNotMember) + refusals(t, reg, refusedWrongName); got != 4 {
		t.Errorf("not_member and wrong_name refusals = %v, want 4", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.Equal(h.done, []string{"x:7"}) || h.handedBy != "" {
		t.Errorf("handler saw done words %v and a hand-off from %q; want only x's word for ring 7", h.done, h.handedBy)
	}

	self := NewGuard(GuardConfig{Members: members{"a"}, Self: "a"})
	call := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := self.Unary(t.Context(), &peerpb.HandOffRequest{From: "a", Done: 7}, &grpc.UnaryServerInfo{FullMethod: "HandOff"}, call); status.Code(err) != codes.PermissionDenied {
		t.Errorf("done word under the receiver's own name: %v, want PermissionDenied", err)
	}
}
