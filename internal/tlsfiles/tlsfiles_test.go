package tlsfiles

import (
	"crypto/tls"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/testpki"
)

// handshake runs a TLS handshake between server and client configs over a
// loopback TCP connection (whose buffers, unlike net.Pipe's, let a TLS 1.3
// server send its alert after the client is done) and returns the
// client's view, or the first error.
func handshake(t *testing.T, server, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	errc := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		errc <- tls.Server(c, server).Handshake()
	}()
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	cl := tls.Client(raw, client)
	cerr := cl.Handshake()
	if cerr != nil {
		raw.Close() // the server may be waiting for more
	}
	serr := <-errc
	if cerr != nil {
		return tls.ConnectionState{}, cerr
	}
	if serr != nil {
		return tls.ConnectionState{}, serr
	}
	return cl.ConnectionState(), nil
}

func load(t *testing.T, f testpki.Files) *Source {
	t.Helper()
	s, err := Load(Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster")
	server := load(t, ca.Issue(t, "a").Write(t, dir, "a", ca))
	client := load(t, ca.Issue(t, "b").Write(t, dir, "b", ca))
	cs, err := handshake(t, server.ServerConfig(), client.ClientConfig(""))
	if err != nil {
		t.Fatalf("handshake with certificates from the cluster CA: %v", err)
	}
	if got := cs.PeerCertificates[0].Subject.CommonName; got != "a" {
		t.Errorf("server presented %q, want a", got)
	}
}

func TestRefusesStrangers(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "cluster")
	other := testpki.NewCA(t, "other")
	server := load(t, ca.Issue(t, "a").Write(t, dir, "a", ca))
	stranger := load(t, other.Issue(t, "b").Write(t, dir, "b", other))
	anonymous, err := Load(Files{CA: dir + "/a-ca.crt"}, nil) // trusts the server, has no certificate
	if err != nil {
		t.Fatal(err)
	}
	for name, client := range map[string]*tls.Config{
		"certificate from another CA": stranger.ClientConfig(""),
		"no certificate":              anonymous.ClientConfig(""),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := handshake(t, server.ServerConfig(), client); err == nil {
				t.Fatal("handshake succeeded")
			}
		})
	}
	t.Run("server from another CA", func(t *testing.T) {
		client := load(t, ca.Issue(t, "c").Write(t, dir, "c", ca))
		if _, err := handshake(t, stranger.ServerConfig(), client.ClientConfig("")); err == nil {
			t.Fatal("client accepted a server certificate from another CA")
		}
	})
}

func TestServerName(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	f := ca.Issue(t, "node", "rl.example", "127.0.0.1").Write(t, dir, "s", ca)
	server, err := Load(Files{Cert: f.Cert, Key: f.Key}, nil) // no client certificates asked for
	if err != nil {
		t.Fatal(err)
	}
	trust, err := Load(Files{CA: dir + "/s-ca.crt"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"rl.example", "127.0.0.1", ""} {
		if _, err := handshake(t, server.ServerConfig(), trust.ClientConfig(name)); err != nil {
			t.Errorf("name %q: %v", name, err)
		}
	}
	if _, err := handshake(t, server.ServerConfig(), trust.ClientConfig("other.example")); err == nil {
		t.Error("name other.example: accepted a certificate not valid for it")
	}
}

// TestReload rotates the certificate and the CA under a running Source, as
// cert-manager does, and checks that the next handshake uses the new files,
// and that a half-written rotation keeps the old ones.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca-1")
	f := ca.Issue(t, "one").Write(t, dir, "a", ca)
	server := load(t, f)
	client := load(t, ca.Issue(t, "client").Write(t, dir, "b", ca))

	cs, err := handshake(t, server.ServerConfig(), client.ClientConfig(""))
	if err != nil || cs.PeerCertificates[0].Subject.CommonName != "one" {
		t.Fatalf("before rotation: %v", err)
	}

	// A new key written before its certificate: the pair does not match,
	// so the old one stays.
	next := ca.Issue(t, "two")
	replace(t, f.Key, next.KeyPEM)
	cs, err = handshake(t, server.ServerConfig(), client.ClientConfig(""))
	if err != nil || cs.PeerCertificates[0].Subject.CommonName != "one" {
		t.Fatalf("half-written rotation: got %v, want the old certificate still in use", err)
	}
	replace(t, f.Cert, next.CertPEM)
	cs, err = handshake(t, server.ServerConfig(), client.ClientConfig(""))
	if err != nil || cs.PeerCertificates[0].Subject.CommonName != "two" {
		t.Fatalf("after rotation: %v, want the new certificate", err)
	}

	// A new CA replaces the old one: certificates of the old CA are no
	// longer accepted, those of the new one are.
	ca2 := testpki.NewCA(t, "ca-2")
	replace(t, f.CA, ca2.PEM)
	if _, err := handshake(t, server.ServerConfig(), client.ClientConfig("")); err == nil {
		t.Error("after a CA rotation, a client of the old CA was accepted")
	}
	client2 := load(t, ca2.Issue(t, "client").Write(t, t.TempDir(), "c", ca))
	if _, err := handshake(t, server.ServerConfig(), client2.ClientConfig("")); err != nil {
		t.Errorf("after a CA rotation, a client of the new CA: %v", err)
	}
}

// replace puts data at path as a new file, as the kubelet and cert-manager
// do (a rename, not a write in place whose time stamp may not change
// within the file system's clock tick).
func replace(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	f := ca.Issue(t, "a").Write(t, dir, "a", ca)
	garbage := dir + "/garbage"
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		files Files
		want  string
	}{
		{"nothing", Files{}, "no files"},
		{"cert without key", Files{Cert: f.Cert}, "give both or neither"},
		{"key without cert", Files{Key: f.Key, CA: f.CA}, "give both or neither"},
		{"missing cert", Files{Cert: dir + "/nope", Key: f.Key}, dir + "/nope"},
		{"key of another cert", Files{Cert: f.Cert, Key: garbage}, garbage},
		{"CA not PEM", Files{CA: garbage}, "no PEM certificate"},
		{"missing CA", Files{CA: dir + "/nope"}, dir + "/nope"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.files, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
