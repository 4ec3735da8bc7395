package node

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/internal/tlsfiles"
)

// transport is how a node's listeners and peer connections are secured,
// from the TLS settings.
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
// It names rlnode's flags: it is what an operator reads at start and in
// /readyz.
func (c Config) insecure() string {
	var open []string
	if c.PeerTLS == (tlsfiles.Files{}) {
		open = append(open, "the peer port has no mutual TLS (--peer-tls-cert, --peer-tls-key, --peer-tls-ca)")
	}
	if len(c.GossipKeys) == 0 {
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
