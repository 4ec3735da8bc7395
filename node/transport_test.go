package node

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
)

// TestMatchName: a --member-names pattern matches label by label, a *
// never crossing a dot.
func TestMatchName(t *testing.T) {
	const p = "rl-*.rl-headless.ns.svc"
	for name, want := range map[string]bool{
		"rl-0.rl-headless.ns.svc":      true,
		"rl-12.rl-headless.ns.svc":     true,
		"rl-0.evil.rl-headless.ns.svc": false,
		"rl-0.rl-headless.ns.svc.x":    false,
		"ingress.rl-headless.ns.svc":   false,
		"rl-0.rl-headless.other.svc":   false,
		"":                             false,
	} {
		if got := matchName(p, name); got != want {
			t.Errorf("matchName(%q, %q) = %v, want %v", p, name, got, want)
		}
	}
	if err := checkNamePattern("rl-[.x"); err == nil {
		t.Error("a malformed pattern passed")
	}
}

// TestAdmitAndDial: admit takes a member only if the certificate at its
// peer port names it and its name matches --member-names, and a peer
// connection is taken only if the certificate names a member at the
// address dialled.
func TestAdmitAndDial(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	dir := t.TempDir()
	serve := func(ca *testpki.CA, name string) string {
		lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, name, name).TLS(t)}, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		return acceptAll(t, lis, func(c net.Conn) { c.(*tls.Conn).Handshake() })
	}
	b, other := serve(ca, "rl-1.ns"), serve(ca, "ingress.ns")
	strange := serve(testpki.NewCA(t, "stranger"), "rl-3.ns")
	plain, closed := plainPort(t), closedPort(t)
	f := ca.Issue(t, "rl-0.ns", "rl-0.ns").Write(t, dir, "self", ca)
	conf := DefaultConfig()
	conf.NodeName, conf.MemberNames = "rl-0.ns", "rl-*.ns"
	conf.PeerTLS = tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}
	at := map[string][]string{b: {"rl-1.ns"}, other: {"rl-2.ns"}}
	tr, err := newTransport(conf, slog.New(slog.DiscardHandler), func(addr string) []string { return at[addr] })
	if err != nil {
		t.Fatal(err)
	}
	// A verdict on who the member is is marked cluster.Refused; a check
	// that could not be made is not, and is retried soon.
	for _, tc := range []struct {
		name, addr, err string
		refused         bool
	}{
		{"rl-1.ns", b, "", false},
		{"rl-2.ns", other, "does not name", true},
		{"rl-2.ns", b, "does not name", true}, // an address another member serves
		{"ingress.ns", other, "does not match", true},
		{"rl-3.ns", strange, "unknown authority", true},
		{"rl-4.ns", plain, "peer port", true},
		{"rl-5.ns", closed, "connection refused", false},
	} {
		err := tr.admit(t.Context(), tc.name, tc.addr)
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("admit %s at %s: %v, want %q", tc.name, tc.addr, err, tc.err)
		}
		if got := cluster.IsRefused(err); got != tc.refused {
			t.Errorf("admit %s at %s: %v: refused %v, want %v", tc.name, tc.addr, err, got, tc.refused)
		}
	}
	if err := tr.ownName("rl-0.ns"); err != nil {
		t.Errorf("ownName of the name the certificate carries: %v", err)
	}
	if err := tr.ownName("rl-9.ns"); err == nil || !strings.Contains(err.Error(), `does not name it (--node-name "rl-9.ns")`) {
		t.Errorf("ownName of another name: %v, want the certificate and the name", err)
	}
	mc := memberCreds{TransportCredentials: credentials.NewTLS(tr.peerSrc.ClientConfig("")), membersAt: func(addr string) []string { return at[addr] }}
	for addr, ok := range map[string]bool{b: true, other: false} {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn, _, err := mc.ClientHandshake(context.Background(), addr, raw)
		if (err == nil) != ok {
			t.Errorf("dial %s (%v): %v, want ok %v", addr, at[addr], err, ok)
		}
		if conn != nil {
			conn.Close()
		}
		raw.Close()
	}
	conf.NodeName = "ingress.ns"
	if _, err := newTransport(conf, slog.New(slog.DiscardHandler), nil); err == nil || !strings.Contains(err.Error(), "--member-names") {
		t.Errorf("a node whose own name does not match: %v, want an error naming --member-names", err)
	}
}

// acceptAll serves lis until the test ends, calling serve on each
// connection and then closing it, and returns its address.
func acceptAll(t *testing.T, lis net.Listener, serve func(net.Conn)) string {
	t.Helper()
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { serve(c); c.Close() }()
		}
	}()
	return lis.Addr().String()
}

// plainPort returns the address of a port that answers a TLS hello with
// plain text, as an HTTP server would.
func plainPort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return acceptAll(t, lis, func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) })
}

// closedPort returns an address no one listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}
