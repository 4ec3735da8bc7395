package main

import (
	"flag"

	"github.com/ringlimit/ringlimit/client"
)

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
