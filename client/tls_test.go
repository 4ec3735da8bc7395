package client_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/testpki"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
	"github.com/ringlimit/ringlimit/service"
)

// TestTLS reaches a node that serves TLS and asks for client certificates
// (rlnode --tls-cert --tls-key --tls-client-ca): only a client that trusts
// the node's CA, checks the right name and presents a certificate of the
// client CA gets an answer.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	srvFiles := ca.Issue(t, "rlnode", "127.0.0.1", "rl.example").Write(t, dir, "server", ca)
	cliFiles := ca.Issue(t, "app").Write(t, dir, "client", ca)
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: srvFiles.Cert, Key: srvFiles.Key, CA: srvFiles.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(src.ServerConfig())))
	api.New(api.Config{Checker: service.New(service.Config{})}).RegisterGRPC(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	addr := lis.Addr().String()

	for _, tc := range []struct {
		name string
		tls  client.TLS
		ok   bool
	}{
		{"CA and client certificate", client.TLS{CA: srvFiles.CA, Cert: cliFiles.Cert, Key: cliFiles.Key}, true},
		{"server name given", client.TLS{CA: srvFiles.CA, Cert: cliFiles.Cert, Key: cliFiles.Key, ServerName: "rl.example"}, true},
		{"wrong server name", client.TLS{CA: srvFiles.CA, Cert: cliFiles.Cert, Key: cliFiles.Key, ServerName: "other.example"}, false},
		{"no client certificate", client.TLS{CA: srvFiles.CA}, false},
		{"system roots", client.TLS{Cert: cliFiles.Cert, Key: cliFiles.Key}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt, err := tc.tls.DialOption(addr)
			if err != nil {
				t.Fatal(err)
			}
			c, err := client.New(addr, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = c.Allow(ctx, client.Limit{Name: "api", Count: 10, Period: time.Minute}, "user:1")
			if (err == nil) != tc.ok {
				t.Errorf("Allow: %v, want success %v", err, tc.ok)
			}
		})
	}
	t.Run("plaintext", func(t *testing.T) {
		c, err := client.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Allow(ctx, client.Limit{Name: "api", Count: 10, Period: time.Minute}, "user:1"); err == nil {
			t.Error("a plaintext client got an answer from a TLS node")
		}
	})
	if _, err := (client.TLS{}).Config("no-port"); err == nil {
		t.Error("Config of an address without a port and no ServerName succeeded")
	}
}
