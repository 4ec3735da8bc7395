package client

import (
	"crypto/tls"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/internal/tlsfiles"
)

// TLS says how to reach a node that serves TLS (rlnode --tls-cert). The
// zero value verifies the node against the system roots and presents no
// certificate. Files are read when Config is called and read again when
// they change, so a long-lived client takes up a rotated certificate.
type TLS struct {
	// CA is a PEM bundle the node's certificate must chain to; empty means
	// the system roots.
	CA string
	// Cert and Key are a PEM client certificate and its key, for a node
	// that asks for one (rlnode --tls-client-ca); both or neither.
	Cert, Key string
	// ServerName is the name the node's certificate must be valid for;
	// empty means the host of the address dialled.
	ServerName string
}

// Config returns the TLS config for reaching the node at addr (host:port).
func (t TLS) Config(addr string) (*tls.Config, error) {
	name := t.ServerName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("tls: server name from %q: %w (set a server name)", addr, err)
		}
		name = host
	}
	if t.CA == "" && t.Cert == "" && t.Key == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}, nil
	}
	src, err := tlsfiles.Load(tlsfiles.Files{Cert: t.Cert, Key: t.Key, CA: t.CA}, nil)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return src.ClientConfig(name), nil
}

// DialOption returns the option that makes New reach addr over TLS:
//
//	opt, err := client.TLS{CA: "ca.crt"}.DialOption(addr)
//	c, err := client.New(addr, opt)
func (t TLS) DialOption(addr string) (grpc.DialOption, error) {
	c, err := t.Config(addr)
	if err != nil {
		return nil, err
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(c)), nil
}
