package peer

import (
	"crypto/x509"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
