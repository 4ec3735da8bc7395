package resp

import (
	"context"
	"crypto/tls"
	"time"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// Native answers RL.CHECK: the node's gRPC face (package api), which
// decodes and answers its payload exactly as one request of a
// CheckStream, so that a check means the same on either port.
type Native interface {
	// DecodeCheckStream decodes an RL.CHECK payload within the gRPC
	// port's bounds.
	DecodeCheckStream(b []byte, m *pb.CheckStreamRequest) error
	// RESPCheck answers one decoded request.
	RESPCheck(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse
}

// nativeCheck answers RL.CHECK payload: payload is a CheckStreamRequest
// in protobuf, the answer a bulk string of its CheckStreamResponse. The
// Go client sends its batches so (docs/resp.md): a command of a few
// hundred bytes read and answered by this connection's goroutine costs
// the node and the client far less than a message of a gRPC stream,
// which crosses four goroutines on its way. A payload that does not
// decode is answered with an error naming the field, and the connection
// goes on: its framing, RESP's, is intact.
func (c *conn) nativeCheck(args [][]byte) {
	n := c.s.conf.Native
	switch {
	case n == nil:
		c.w.fail("ERR RL.CHECK is not served here")
		return
	case len(args) != 2:
		c.w.fail(arityError(args[0]).Error())
		return
	}
	var req pb.CheckStreamRequest
	if err := n.DecodeCheckStream(args[1], &req); err != nil {
		c.w.fail("ERR RL.CHECK payload: " + err.Error())
		return
	}
	d := c.s.conf.RequestTimeout
	if t := time.Duration(req.GetTimeoutMs()) * time.Millisecond; t > 0 && (d <= 0 || t < d) {
		d = t
	}
	ctx := c.clientContext()
	if d > 0 {
		dc := &deadlineCtx{Context: ctx, deadline: time.Now().Add(d)}
		defer dc.stop()
		ctx = dc
	}
	b, err := wire.Marshal(n.RESPCheck(ctx, &req))
	if err != nil { // a result the node built itself: never expected
		c.w.fail("ERR RL.CHECK answer: " + err.Error())
		return
	}
	c.w.bulk(b)
}

// clientContext returns the context that names the connection's client (package
// clients: its verified certificate's name, else its address range), as
// a gRPC or HTTP request's does, made once.
func (c *conn) clientContext() context.Context {
	if c.clientCtx == nil {
		var state *tls.ConnectionState
		if tc, ok := c.nc.(*tls.Conn); ok {
			s := tc.ConnectionState()
			state = &s
		}
		c.clientCtx = clients.NewContext(context.Background(), clients.Of(c.raw.RemoteAddr().String(), state))
	}
	return c.clientCtx
}
