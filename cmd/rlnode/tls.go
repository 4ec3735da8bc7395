package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/tlsfiles"
)

// transport is how a node's listeners and peer connections are secured,
// from the TLS flags.
type transport struct {
	// peerServer and peerDial secure the peer port and the connections to
	// other nodes' peer ports: mutual TLS with the cluster CA, or plaintext.
	peerServer []grpc.ServerOption
	peerDial   []grpc.DialOption
	// public is the config of the HTTP and gRPC listeners; nil means
	// plaintext.
	public *tls.Config
	// peerTLS reports whether peers authenticate with certificates.
	peerTLS bool
}

// newTransport loads the TLS files named by conf. A file that cannot be
// read fails here, naming its flag; later changes are picked up at the next
// handshake (see tlsfiles).
func newTransport(conf Config, log *slog.Logger) (transport, error) {
	t := transport{peerDial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}
	if conf.PeerTLS != (tlsfiles.Files{}) {
		src, err := tlsfiles.Load(conf.PeerTLS, log.With("tls", "peer"))
		if err != nil {
			return transport{}, fmt.Errorf("--peer-tls-*: %w", err)
		}
		t.peerServer = []grpc.ServerOption{grpc.Creds(credentials.NewTLS(src.ServerConfig()))}
		t.peerDial = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig("")))}
		t.peerTLS = true
	}
	if conf.TLS != (tlsfiles.Files{}) {
		src, err := tlsfiles.Load(conf.TLS, log.With("tls", "public"))
		if err != nil {
			return transport{}, fmt.Errorf("--tls-*: %w", err)
		}
		t.public = src.ServerConfig()
	}
	return t, nil
}

// insecure returns a warning naming what leaves the cluster open to anyone
// on its network, or "" when peers authenticate and gossip is encrypted.
func (t transport) insecure(conf Config) string {
	var open []string
	if !t.peerTLS {
		open = append(open, "the peer port has no mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)")
	}
	if len(conf.GossipKeys) == 0 {
		open = append(open, "gossip is not encrypted (--gossip-key)")
	}
	if len(open) == 0 {
		return ""
	}
	return "warning: " + strings.Join(open, " and ") + ": anyone who can reach those ports can join the cluster, take its counters and change its limits"
}

// grpcServer returns the options of the public gRPC server.
func (t transport) grpcServer() []grpc.ServerOption {
	if t.public == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.public))}
}

// clientTLS is the TLS flags of the client commands (check, members,
// bench), which match a node's --tls-* flags.
type clientTLS struct {
	on   bool
	conf client.TLS
}

// addClientTLS defines the client TLS flags on fs.
func addClientTLS(fs *flag.FlagSet) *clientTLS {
	t := &clientTLS{}
	fs.BoolVar(&t.on, "tls", false, "reach the node over TLS (implied by any other --tls-* flag)")
	fs.StringVar(&t.conf.CA, "tls-ca", "", "PEM CA the node's certificate must chain to (default: the system roots)")
	fs.StringVar(&t.conf.Cert, "tls-cert", "", "PEM client certificate, for a node started with --tls-client-ca")
	fs.StringVar(&t.conf.Key, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&t.conf.ServerName, "tls-server-name", "", "name the node's certificate must be valid for (default: the host of the address)")
	return t
}

// config returns the settings, or nil for plaintext.
func (t *clientTLS) config() *client.TLS {
	if !t.on && t.conf == (client.TLS{}) {
		return nil
	}
	c := t.conf
	return &c
}

// dialOptions returns the gRPC options that reach addr as the flags say.
func dialOptions(t *client.TLS, addr string) ([]grpc.DialOption, error) {
	if t == nil {
		return nil, nil // client.New's plaintext default
	}
	opt, err := t.DialOption(addr)
	if err != nil {
		return nil, fmt.Errorf("--tls-*: %w", err)
	}
	return []grpc.DialOption{opt}, nil
}

// httpBase returns the URL prefix of addr's HTTP interface and the
// transport that reaches it as t says, cloned from base.
func httpBase(t *client.TLS, addr string, base *http.Transport) (string, *http.Transport, error) {
	tr := base.Clone()
	if t == nil {
		return "http://" + addr, tr, nil
	}
	c, err := t.Config(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--tls-*: %w", err)
	}
	tr.TLSClientConfig = c
	return "https://" + addr, tr, nil
}
