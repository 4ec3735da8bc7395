package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/internal/nodeport"
)

// A node has an HTTP port (rlnode members and top read it) and a gRPC
// port (rlnode check calls it), and a RESP port when asked; a command
// given the wrong one fails with the other protocol's error ("http2:
// frame too large", a malformed HTTP response). wrongPort turns such a
// failure into one that says which port the address is and which the
// command wants.

// wrongPort returns err, or, if addr serves another of a node's ports
// than want (so the Go client found, or a probe of addr within
// nodeport.ProbeTimeout finds), an error saying so for cmd, such as
// "rlnode top".
func wrongPort(ctx context.Context, err error, cmd, addr string, want nodeport.Port, t *client.TLS) error {
	var found *nodeport.Error
	if errors.As(err, &found) {
		said := *found
		said.Client = cmd
		return &said
	}
	if !mayBeWrongPort(err, want) {
		return err
	}
	var conf *tls.Config
	if t != nil {
		var cerr error
		if conf, cerr = t.Config(addr); cerr != nil {
			return err
		}
	}
	if found := nodeport.Check(context.WithoutCancel(ctx), addr, want, conf, cmd); found != nil {
		return found
	}
	return err
}

// mayBeWrongPort reports whether err, of a client of want, is one that
// the wrong protocol could cause: a gRPC call that found no server, an
// HTTP request that had no well-formed answer.
func mayBeWrongPort(err error, want nodeport.Port) bool {
	if want == nodeport.GRPC {
		code := status.Code(err)
		return code == codes.Unavailable || code == codes.DeadlineExceeded
	}
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial" // nothing listens: not a wrong port
}
