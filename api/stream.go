package api

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// CheckStreamMethod is the full name of the CheckStream RPC, for
// admit.Config.Streams: its calls are long-lived, and each of their
// requests takes a slot of its own (Config.AdmitMessage).
const CheckStreamMethod = "/ringlimit.v1.RateLimiter/CheckStream"

// CheckStream decides the requests of a stream, each as Check decides a
// request (see mux.Server.Serve): the codec of ServerOptions bounds each
// as it bounds a CheckRequest, Config.AdmitMessage admits each, and one
// refused whole is answered with its status.
func (g grpcServer) CheckStream(stream pb.RateLimiter_CheckStreamServer) error {
	if port := g.s.conf.RESPPort; port != 0 {
		// Sent with the first answer: the header costs no frame of its own.
		_ = stream.SetHeader(metadata.Pairs(RESPPortHeader, strconv.Itoa(port)))
	}
	return g.s.streams.Serve(stream)
}

// Drain asks the client of every CheckStream to end it, answering what it
// sent until then: a node that stops does so before it stops its gRPC
// server, which waits for every stream to end. The Go client then sends
// its checks in Check RPCs, which the stopping server refuses as usual.
func (s *Server) Drain() { s.streams.Drain() }

// notice asks a client to end its CheckStream, for reason.
func notice(reason error) *pb.CheckStreamResponse {
	return &pb.CheckStreamResponse{Status: mux.Status(reason)}
}

func streamTimeout(req *pb.CheckStreamRequest) time.Duration {
	return time.Duration(req.GetTimeoutMs()) * time.Millisecond
}

// checkMessage answers one request of a CheckStream.
func (s *Server) checkMessage(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	return s.answerStream(ctx, req, "grpc_stream")
}

// answerStream answers req, a request of a CheckStream or of RL.CHECK;
// iface labels its latency.
func (s *Server) answerStream(ctx context.Context, req *pb.CheckStreamRequest, iface string) *pb.CheckStreamResponse {
	resp := &pb.CheckStreamResponse{Id: req.GetId()}
	if theirs := req.GetRing(); theirs != 0 {
		if ours := s.ringID().sum; theirs != ours {
			resp.Ring = ours
		}
	}
	if s.conf.AdmitMessage != nil {
		done, err := s.conf.AdmitMessage(int64(wire.Size(req)))
		if err != nil {
			resp.Status = mux.Status(err)
			return resp
		}
		defer done()
	}
	defer s.observe(iface, time.Now())
	r, err := s.conf.Checker.Check(ctx, &pb.CheckRequest{Requests: req.GetRequests(), All: req.GetAll()})
	if err != nil {
		resp.Status = mux.Status(toStatus(err))
		return resp
	}
	resp.Responses = r.GetResponses()
	return resp
}
