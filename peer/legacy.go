package peer

import (
	"context"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// LegacyServiceName is the name the Peer service had while its messages
// lived in the public API's package (ringlimit.v1), before they moved to
// their own, internal/peerpb (ringlimit.peer.v1). The methods and messages
// are the same on the wire under both names. A Server serves both, and a
// Pool calls a node under the old name once it finds that the node knows
// only that one, so that nodes of both versions work together through a
// rolling upgrade. A later version may drop the old name: upgrade through
// this one.
const LegacyServiceName = "ringlimit.v1.Peer"

// serviceName is the Peer service's name now.
var serviceName = peerpb.Peer_ServiceDesc.ServiceName

// legacyDesc is the Peer service under LegacyServiceName, with the same
// handlers.
func legacyDesc() *grpc.ServiceDesc {
	d := peerpb.Peer_ServiceDesc
	d.ServiceName = LegacyServiceName
	return &d
}

// versions picks the name under which one connection calls the Peer
// service: the current one until the node answers codes.Unimplemented for
// it (it is of the version before the rename), then the legacy one. A
// call refused that way reached no handler, so sending it again under the
// other name cannot count it twice. It is safe for concurrent use.
type versions struct{ legacy atomic.Bool }

// dialOptions are the interceptors that rename the connection's calls.
func (v *versions) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(v.unary), grpc.WithChainStreamInterceptor(v.stream)}
}

func (v *versions) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	old, ok := legacyMethod(method)
	if !ok || v.legacy.Load() {
		return invoke(ctx, v.name(method, old, ok), req, reply, cc, opts...)
	}
	err := invoke(ctx, method, req, reply, cc, opts...)
	if status.Code(err) != codes.Unimplemented {
		return err
	}
	v.legacy.Store(true)
	return invoke(ctx, old, req, reply, cc, opts...)
}

// stream opens a stream under the name known to work. A stream the node
// does not serve fails at its first message, not here: the Pool then
// sends in Forward RPCs (see Pool.Start), whose first refusal switches the
// connection to the legacy name, which its next stream uses.
func (v *versions) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, open grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	old, ok := legacyMethod(method)
	return open(ctx, desc, cc, v.name(method, old, ok), opts...)
}

func (v *versions) name(method, old string, ok bool) string {
	if ok && v.legacy.Load() {
		return old
	}
	return method
}

// newerMethods are the Peer methods added since the rename, which no node
// of the version before it serves: a call of one that a node refuses is
// not sent again under the old name, nor makes the connection use it.
var newerMethods = map[string]bool{"Lease": true, "Settle": true, "Top": true}

// legacyMethod returns method, a Peer method's full name, under
// LegacyServiceName; false for any other method, and for newerMethods.
func legacyMethod(method string) (string, bool) {
	rest, ok := strings.CutPrefix(method, "/"+serviceName+"/")
	if !ok || newerMethods[rest] {
		return "", false
	}
	return "/" + LegacyServiceName + "/" + rest, true
}
