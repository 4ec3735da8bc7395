package clients

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

func TestOf(t *testing.T) {
	verified := func(cert *x509.Certificate) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	}
	for _, c := range []struct {
		remote string
		state  *tls.ConnectionState
		want   ID
	}{
		{"192.0.2.17:4711", nil, "ip:192.0.2.0/24"},
		{"192.0.2.200:1", nil, "ip:192.0.2.0/24"},
		{"[2001:db8:1:2:3:4:5:6]:443", nil, "ip:2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.9]:80", nil, "ip:192.0.2.0/24"},
		{"192.0.2.17", nil, "ip:192.0.2.0/24"},
		{"@", nil, "addr:@"},
		{"192.0.2.17:4711", verified(&x509.Certificate{Subject: pkix.Name{CommonName: "billing"}}), "tls:billing"},
		{"192.0.2.17:4711", verified(&x509.Certificate{DNSNames: []string{"api.example"}}), "tls:api.example"},
		// A certificate the node did not verify (no client CA) names no one.
		{"192.0.2.17:4711", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "forged"}}}}, "ip:192.0.2.0/24"},
	} {
		if got := Of(c.remote, c.state); got != c.want {
			t.Errorf("Of(%q, %v) = %q, want %q", c.remote, c.state != nil, got, c.want)
		}
	}
}

func TestFromContext(t *testing.T) {
	if id := FromContext(context.Background()); id != "" {
		t.Errorf("no client: %q", id)
	}
	addr := &net.TCPAddr{IP: net.ParseIP("198.51.100.7"), Port: 9}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
		VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: "envoy"}}}}}}})
	if id := FromContext(ctx); id != "tls:envoy" {
		t.Errorf("gRPC over verified TLS: %q, want tls:envoy", id)
	}
	if id := FromContext(peer.NewContext(context.Background(), &peer.Peer{Addr: addr})); id != "ip:198.51.100.0/24" {
		t.Errorf("gRPC without TLS: %q", id)
	}
	if id := FromContext(NewContext(ctx, "ip:203.0.113.0/24")); id != "ip:203.0.113.0/24" {
		t.Errorf("NewContext's: %q", id)
	}
}

// TestQuota: a client holds at most Max entries at once; a returned one,
// or a kept one past its time, makes room again; clients do not share.
func TestQuota(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	q := NewQuota(3)
	for i := range 3 {
		if !q.Claim("a", t0) {
			t.Fatalf("claim %d of 3 refused", i)
		}
	}
	if q.Claim("a", t0) {
		t.Fatal("a 4th claim of 3 admitted")
	}
	if !q.Claim("b", t0) {
		t.Fatal("another client refused while the first holds its most")
	}
	q.Return("a")
	q.Keep("a", t0.Add(time.Minute))
	q.Keep("a", t0.Add(time.Hour))
	if !q.Claim("a", t0) || q.Claim("a", t0) {
		t.Fatal("after a return: want one more claim, then none")
	}
	if n := q.Refused(); n != 2 {
		t.Errorf("Refused() = %d, want 2", n)
	}
	q.Return("a") // the last claim, unused
	if got := q.Held("a", t0.Add(time.Minute)); got != 1 {
		t.Errorf("a minute on: %d held, want 1 (the one kept for an hour)", got)
	}
	if got := q.Held("a", t0.Add(time.Hour)); got != 0 || len(q.held) != 1 {
		t.Errorf("an hour on: %d held and %d clients counted, want 0 and 1 (b)", got, len(q.held))
	}
}
