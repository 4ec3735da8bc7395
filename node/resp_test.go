package node_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/node/nodetest"
)

// TestRESPPortHasTheHTTPPortsProtection: the RESP port serves with the
// client ports' TLS (client certificates required when --tls-client-ca
// is set) and within --max-conns-per-source.
func TestRESPPortHasTheHTTPPortsProtection(t *testing.T) {
	ca := testpki.NewCA(t, "clients")
	f := ca.Issue(t, "node", "127.0.0.1").Write(t, t.TempDir(), "server", ca)
	conf := nodetest.Config("resp-tls")
	conf.RESPAddr = "127.0.0.1:0"
	conf.TLS = tlsfiles.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}
	conf.MaxConnsPerSource = 2
	n, _ := nodetest.Start(t, conf)
	addr := n.RESPAddr()

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	clientCert := ca.Issue(t, "app").TLS(t)
	withCert := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{clientCert}, ServerName: "127.0.0.1"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	rdb := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: withCert, PoolSize: 1, MaxRetries: -1})
	defer rdb.Close()
	v, err := rdb.Do(ctx, "CL.THROTTLE", "tls", 15, 30, 60).Int64Slice()
	if err != nil || len(v) != 5 || v[1] != 16 {
		t.Fatalf("over TLS: %v, %v; want redis-cell's answer", v, err)
	}

	for name, cfg := range map[string]*tls.Config{
		"plaintext":             nil,
		"no client certificate": {RootCAs: roots, ServerName: "127.0.0.1"},
	} {
		c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, PoolSize: 1, MaxRetries: -1, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second})
		if err := c.Ping(ctx).Err(); err == nil {
			t.Errorf("%s: PING answered, want the connection refused", name)
		}
		c.Close()
	}

	// rdb holds one connection from 127.0.0.1; a second is allowed (once
	// the server has closed the refused ones above), a third is closed as
	// soon as it is accepted.
	var held *tls.Conn
	for deadline := time.Now().Add(10 * time.Second); held == nil; time.Sleep(10 * time.Millisecond) {
		if held, err = tls.Dial("tcp", addr, withCert); err != nil && time.Now().After(deadline) {
			t.Fatalf("a second connection from one source: %v", err)
		}
	}
	defer held.Close()
	third, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := third.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !closedErr(err) {
		t.Fatalf("a third connection from one source: read %v, want it closed", err)
	}
}

// closedErr reports an error of reading a connection the other side has
// closed (a reset), rather than a timeout.
func closedErr(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
