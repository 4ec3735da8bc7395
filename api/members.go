package api

import (
	"context"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/ring"
)

// RingHeader is the gRPC metadata key of ring fingerprints. A client that
// sends each check to its key's owner sends, with each Check, the
// fingerprint of the ring it routed by (MembersResponse.ring in lower-case
// hex); a node whose ring has another fingerprint answers with its own in
// the response header of the same name, so that the client asks Members
// again. Nodes whose rings agree stay silent, and a Check without the
// header gets none.
const RingHeader = "ringlimit-ring"

// ringID is a ring with its fingerprint, worked out once per ring: the
// cluster publishes a new *ring.Ring on every change and none otherwise.
type ringID struct {
	ring *ring.Ring
	hex  string // the fingerprint, as RingHeader carries it
	sum  uint64
}

// ringID returns the current ring and its fingerprint.
func (s *Server) ringID() *ringID {
	var r *ring.Ring
	if s.conf.Ring != nil {
		r = s.conf.Ring()
	}
	if id := s.ring.Load(); id != nil && id.ring == r {
		return id
	}
	sum := fingerprint(r.Members())
	id := &ringID{ring: r, hex: strconv.FormatUint(sum, 16), sum: sum}
	s.ring.Store(id) // racing stores store equal values
	return id
}

// fingerprint hashes the names and client addresses of members, which
// Ring.Members sorts by name: what a client builds its ring from and
// dials. Each field ends with a NUL, which names and addresses cannot
// contain, so that no two member lists hash the same bytes.
func fingerprint(members []ring.Member) uint64 {
	var d xxhash.Digest
	d.Reset()
	for _, m := range members {
		d.WriteString(m.Name)
		d.Write([]byte{0})
		d.WriteString(m.GRPCAddr)
		d.Write([]byte{0})
	}
	return d.Sum64()
}

func (g grpcServer) Members(context.Context, *pb.MembersRequest) (*pb.MembersResponse, error) {
	id := g.s.ringID()
	resp := &pb.MembersResponse{Ring: id.sum}
	for _, m := range id.ring.Members() {
		resp.Members = append(resp.Members, &pb.Member{Name: m.Name, GrpcAddr: m.GRPCAddr})
	}
	return resp, nil
}

// tellStaleRing answers a Check whose RingHeader differs from this node's
// ring with this node's fingerprint. It costs a metadata look-up, and
// nothing more for clients that do not route.
func (s *Server) tellStaleRing(ctx context.Context) {
	theirs := metadata.ValueFromIncomingContext(ctx, RingHeader)
	if len(theirs) == 0 {
		return
	}
	if ours := s.ringID().hex; theirs[0] != ours {
		grpc.SetHeader(ctx, metadata.Pairs(RingHeader, ours))
	}
}
