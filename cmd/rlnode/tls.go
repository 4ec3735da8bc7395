package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/cluster"
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

// membership is the cluster as peer.Guard asks it who is who.
type membership struct{ *cluster.Cluster }

func (m membership) Owner(key string) (string, bool) {
	o, ok := m.Ring().Owner(key)
	return o.Name, ok
}

// grpcServer returns the options of the public gRPC server.
func (t transport) grpcServer() []grpc.ServerOption {
	if t.public == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.public))}
}
