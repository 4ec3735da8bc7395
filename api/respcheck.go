package api

import (
	"context"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/respcall"
)

// RESPPortHeader is the header of a CheckStream that names the port of
// the node's RESP listener (Config.RESPPort), where RL.CHECK carries the
// stream's requests for less than gRPC costs a message (docs/resp.md).
const RESPPortHeader = respcall.PortHeader

// checkStreamBound bounds the items of a CheckStreamRequest, as the gRPC
// port's codec does.
var checkStreamBound = BoundOf(&pb.CheckStreamRequest{}, "requests", checks.MaxItems)

// DecodeCheckStream decodes b, the payload of RL.CHECK, into m as the
// gRPC port decodes a CheckStream's request: it builds at most
// checks.MaxItems+1 items (the check then refuses the request as too
// big) and at most MaxMessages messages.
func (s *Server) DecodeCheckStream(b []byte, m *pb.CheckStreamRequest) error {
	return decodeBounded(b, m, checkStreamBound, true)
}

// RESPCheck answers req, RL.CHECK's request, as a CheckStream answers
// one of its requests: admitted by Config.AdmitMessage, decided by the
// Checker, refused whole with a status, the ring compared. ctx carries
// the client (package clients) and ends at the request's timeout.
func (s *Server) RESPCheck(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	return s.answerStream(ctx, req, "resp_check")
}
