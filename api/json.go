package api

import (
	"fmt"
	"strings"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// The JSON shapes of POST /v1/check: snake_case keys, JSON numbers, enums
// by name. They are written out here rather than produced by protojson,
// which would print 64-bit numbers as strings.

// checkItemJSON is one item of a request body, as decodeCheckRequest reads
// it.
type checkItemJSON struct {
	Name          string
	Key           string
	Hits          *int64
	Limit         int64
	DurationMs    int64
	Algorithm     string
	Burst         int64
	Behavior      string
	Reset         bool
	CreatedAtMs   int64
	ChargeRefused bool // see CheckItem in ringlimit.proto
	Policy        string
}

// itemFields are the field names of a check item, exactly as they must be
// spelled.
var itemFields = []string{"name", "key", "hits", "limit", "duration_ms", "algorithm", "burst",
	"behavior", "reset", "created_at_ms", "charge_refused", "policy"}

type checkResponseJSON struct {
	Responses []checkResultJSON `json:"responses"`
}

type checkResultJSON struct {
	Status       string            `json:"status"`
	Limit        int64             `json:"limit"`
	Remaining    int64             `json:"remaining"`
	ResetTimeMs  int64             `json:"reset_time_ms"`
	RetryAfterMs int64             `json:"retry_after_ms"`
	DelayMs      int64             `json:"delay_ms"`
	Error        string            `json:"error,omitempty"`
	ErrorCode    string            `json:"error_code,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

func (it *checkItemJSON) toProto() (*pb.CheckItem, error) {
	item := &pb.CheckItem{
		Name:          it.Name,
		Key:           it.Key,
		Hits:          it.Hits,
		Limit:         it.Limit,
		DurationMs:    it.DurationMs,
		Burst:         it.Burst,
		Reset_:        it.Reset,
		CreatedAtMs:   it.CreatedAtMs,
		ChargeRefused: it.ChargeRefused,
		Policy:        it.Policy,
	}
	if it.Algorithm != "" {
		a, err := algorithms.ParseKind(it.Algorithm)
		if err != nil {
			return nil, &service.FieldError{Field: "algorithm", Reason: err.Error()}
		}
		item.Algorithm = pb.Algorithm(a)
	}
	if it.Behavior != "" {
		b, ok := pb.Behavior_value[strings.ToUpper(it.Behavior)]
		if !ok {
			return nil, &service.FieldError{Field: "behavior", Reason: fmt.Sprintf("unknown behavior %q (want BATCHED, UNBATCHED, GLOBAL or LOCAL)", it.Behavior)}
		}
		item.Behavior = pb.Behavior(b)
	}
	return item, nil
}

// encodeCheckResponse puts resp's results back at their body positions,
// next to the items that failed to parse.
func encodeCheckResponse(d decodedRequest, resp *pb.CheckResponse) checkResponseJSON {
	out := checkResponseJSON{Responses: make([]checkResultJSON, len(d.pos)+len(d.itemErr))}
	for i, err := range d.itemErr {
		out.Responses[i] = checkResultJSON{
			Status:       pb.Status_OVER_LIMIT.String(),
			RetryAfterMs: -1,
			Error:        err.Error(),
			ErrorCode:    pb.ErrorCode_INVALID_ARGUMENT.String(),
		}
	}
	for j, r := range resp.GetResponses() {
		out.Responses[d.pos[j]] = resultJSON(r)
	}
	return out
}

func resultJSON(r *pb.CheckResult) checkResultJSON {
	res := checkResultJSON{
		Status:       r.Status.String(),
		Limit:        r.Limit,
		Remaining:    r.Remaining,
		ResetTimeMs:  r.ResetTimeMs,
		RetryAfterMs: r.RetryAfterMs,
		DelayMs:      r.DelayMs,
		Error:        r.Error,
		Metadata:     r.Metadata,
	}
	if r.ErrorCode != pb.ErrorCode_OK {
		res.ErrorCode = r.ErrorCode.String()
	}
	return res
}
