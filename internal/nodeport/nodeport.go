// Package nodeport knows the ports a node's clients reach (HTTP, gRPC and
// RESP): their flags and default addresses, and how to tell which of them
// serves an address from the first bytes it answers. A client given the
// wrong one (rlnode top given the gRPC port, the Go client given the HTTP
// port) otherwise fails with the other protocol's garbage, such as
// "http2: frame too large" or a malformed HTTP response; after such a
// failure it probes the address (Check) and says which port it reached
// and which it wants.
//
// The first bytes tell the ports apart whatever the client sent: a gRPC
// server (HTTP/2) sends its SETTINGS frame first, an HTTP/1 server answers
// "HTTP/1.1 ...", and the RESP port answers an error line ("-ERR ...") to
// what is not a Redis command, an HTTP request or the HTTP/2 preface
// included.
package nodeport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Port is one of a node's client ports, by the protocol it serves.
type Port int

const (
	Unknown Port = iota // not told apart: no answer, or not one of these
	HTTP
	GRPC
	RESP
)

// The default addresses of the HTTP and gRPC ports; the RESP port has
// none (it is off unless --resp-addr is given).
const (
	DefaultHTTPAddr = ":8080"
	DefaultGRPCAddr = ":8081"
)

// String is the port's name as messages say it.
func (p Port) String() string {
	switch p {
	case HTTP:
		return "HTTP"
	case GRPC:
		return "gRPC"
	case RESP:
		return "RESP (Redis protocol)"
	}
	return "unknown"
}

// where says how a node's p is set: its flag, and its default address.
func (p Port) where() string {
	switch p {
	case HTTP:
		return "a node's --http-addr, default " + DefaultHTTPAddr
	case GRPC:
		return "a node's --grpc-addr, default " + DefaultGRPCAddr
	case RESP:
		return "a node's --resp-addr"
	}
	return ""
}

// Sniff returns the port whose server's first answer begins with b, or
// Unknown. It needs no more than a few bytes: the start of an HTTP/1
// status line, of an HTTP/2 SETTINGS frame's header (length, type 4), or
// of a RESP error or status line.
func Sniff(b []byte) Port {
	switch {
	case bytes.HasPrefix(b, []byte("HTTP/")):
		return HTTP
	case len(b) >= 4 && b[0] == 0 && b[3] == 0x4:
		return GRPC
	case len(b) >= 2 && (b[0] == '-' || b[0] == '+') && b[1] >= 'A' && b[1] <= 'Z':
		return RESP
	}
	return Unknown
}

// ErrWrongPort is wrapped by every *Error.
var ErrWrongPort = errors.New("wrong port")

// Error says that Addr, which a client of the Want port was given,
// serves the Reached port.
type Error struct {
	Addr          string
	Reached, Want Port
	// Client names who wants Want, e.g. "rlnode top"; empty means "this
	// client".
	Client string
}

func (e *Error) Error() string {
	client := e.Client
	if client == "" {
		client = "this client"
	}
	article := "a"
	if e.Reached == HTTP {
		article = "an"
	}
	return fmt.Sprintf("%s: that is %s %s port; %s wants the %s port (%s)", e.Addr, article, e.Reached, client, e.Want, e.Want.where())
}

func (e *Error) Unwrap() error { return ErrWrongPort }

// hello is what a client of a port sends first: the HTTP/2 preface and an
// empty SETTINGS frame for gRPC, a request line for HTTP.
func hello(want Port, addr string) []byte {
	if want == GRPC {
		return []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	}
	return []byte("GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n")
}

// ProbeTimeout bounds a probe that its context does not bound sooner.
const ProbeTimeout = time.Second

// Probe connects to addr (over TLS if t is not nil, with the ALPN of
// want), speaks first as a client of want does, and returns the port
// that answered, or Unknown if none answered within ctx and
// ProbeTimeout.
func Probe(ctx context.Context, addr string, want Port, t *tls.Config) Port {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Unknown
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if t != nil {
		t = t.Clone()
		t.NextProtos = []string{"http/1.1"}
		if want == GRPC {
			t.NextProtos = []string{"h2"}
		}
		tc := tls.Client(c, t)
		if tc.HandshakeContext(ctx) != nil {
			return Unknown
		}
		c = tc
	}
	if _, err := c.Write(hello(want, addr)); err != nil {
		return Unknown
	}
	buf := make([]byte, 16)
	n := 0
	for n < 5 { // enough for every rule of Sniff
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	return Sniff(buf[:n])
}

// Check returns an *Error if addr, given to client (see Error.Client) as
// the want port, serves another of a node's ports; nil if it serves want,
// or did not say (see Probe). Clients call it after a failure that the
// wrong protocol could explain.
func Check(ctx context.Context, addr string, want Port, t *tls.Config, client string) error {
	if got := Probe(ctx, addr, want, t); got != Unknown && got != want {
		return &Error{Addr: addr, Reached: got, Want: want, Client: client}
	}
	return nil
}
