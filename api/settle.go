package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// Settler is what the Settle RPC and POST /v1/settle need of the node:
// package service's Service.
type Settler interface {
	Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error)
}

// maxSettleBytes bounds a settle's body: a name and key at their longest,
// escaped, and the rest.
const maxSettleBytes = 16 << 10

// Settle charges a reservation its real cost or releases it (see
// service.Service.Settle).
func (g grpcServer) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	if g.s.conf.Settler == nil {
		return nil, status.Error(codes.Unimplemented, "this node holds no reservations")
	}
	defer g.s.observe("grpc_settle", time.Now())
	resp, err := g.s.conf.Settler.Settle(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// settleJSON is the body of POST /v1/settle: SettleRequest's fields by
// their names, a missing or null cost releasing the reservation.
type settleJSON struct {
	ReservationID string `json:"reservation_id"`
	Name          string `json:"name"`
	Key           string `json:"key"`
	Cost          *int64 `json:"cost"`
}

// settledJSON is the answer of POST /v1/settle: SettleResponse's fields,
// the state as a check's result is written.
type settledJSON struct {
	State struct {
		Status       string `json:"status"`
		Limit        int64  `json:"limit"`
		Remaining    int64  `json:"remaining"`
		ResetTimeMs  int64  `json:"reset_time_ms"`
		RetryAfterMs int64  `json:"retry_after_ms"`
	} `json:"state"`
	GivenBack int64 `json:"given_back"`
	Forced    int64 `json:"forced"`
	Replayed  bool  `json:"replayed"`
}

// handleSettle answers POST /v1/settle: 200 with the settled state, or an
// error with its status (checks.HTTPStatus): 400 naming the field, 404
// for an unknown or expired reservation, 409 for one settled before with
// another cost, 503 at a node that is not the key's owner.
func (s *Server) handleSettle(w http.ResponseWriter, r *http.Request) {
	if s.conf.Settler == nil {
		writeError(w, http.StatusNotImplemented, errors.New("this node holds no reservations"))
		return
	}
	defer s.observe("http_settle", time.Now())
	var body settleJSON
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxSettleBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("body: %w", err))
		return
	}
	resp, err := s.conf.Settler.Settle(r.Context(), &pb.SettleRequest{
		ReservationId: body.ReservationID, Name: body.Name, Key: body.Key, Cost: body.Cost,
	})
	if err != nil {
		writeError(w, checks.HTTPStatus(err), err)
		return
	}
	var out settledJSON
	st := resp.GetState()
	out.State.Status = st.GetStatus().String()
	out.State.Limit, out.State.Remaining = st.GetLimit(), st.GetRemaining()
	out.State.ResetTimeMs, out.State.RetryAfterMs = st.GetResetTimeMs(), st.GetRetryAfterMs()
	out.GivenBack, out.Forced, out.Replayed = resp.GetGivenBack(), resp.GetForced(), resp.GetReplayed()
	writeJSON(w, http.StatusOK, out)
}
