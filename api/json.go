package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// The JSON shapes of POST /v1/check: snake_case keys, JSON numbers, enums
// by name. They are written out here rather than produced by protojson,
// which would print 64-bit numbers as strings.

type checkRequestJSON struct {
	Requests []json.RawMessage `json:"requests"`
	All      bool              `json:"all"`
}

type checkItemJSON struct {
	Name        string `json:"name"`
	Key         string `json:"key"`
	Hits        *int64 `json:"hits"`
	Limit       int64  `json:"limit"`
	DurationMs  int64  `json:"duration_ms"`
	Algorithm   string `json:"algorithm"`
	Burst       int64  `json:"burst"`
	Behavior    string `json:"behavior"`
	Reset       bool   `json:"reset"`
	CreatedAtMs int64  `json:"created_at_ms"`
	// ChargeRefused and Policy: see CheckItem in ringlimit.proto.
	ChargeRefused bool   `json:"charge_refused"`
	Policy        string `json:"policy"`
}

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

// decodedRequest is a parsed body: the items that parsed, and for those
// that parse as JSON but name an unknown enum, their errors by position.
type decodedRequest struct {
	req     *pb.CheckRequest
	itemErr map[int]error // position in the body -> error
	pos     []int         // position in the body of each item of req
}

// decodeCheckRequest parses a POST /v1/check body. Malformed JSON, a wrong
// type, an unknown field or too many items is an error naming the field;
// an unknown enum name is the item's own error.
func decodeCheckRequest(body []byte) (decodedRequest, error) {
	var raw checkRequestJSON
	if err := strictUnmarshal(body, &raw); err != nil {
		return decodedRequest{}, fieldError("", err)
	}
	if len(raw.Requests) > service.MaxItems {
		return decodedRequest{}, fmt.Errorf("requests: %d items, at most %d allowed", len(raw.Requests), service.MaxItems)
	}
	d := decodedRequest{req: &pb.CheckRequest{All: raw.All, Requests: make([]*pb.CheckItem, 0, len(raw.Requests))}}
	for i, msg := range raw.Requests {
		var it checkItemJSON
		if err := strictUnmarshal(msg, &it); err != nil {
			return decodedRequest{}, fieldError(fmt.Sprintf("requests[%d]", i), err)
		}
		item, err := it.toProto()
		if err != nil {
			if d.itemErr == nil {
				d.itemErr = make(map[int]error)
			}
			d.itemErr[i] = err
			continue
		}
		d.req.Requests = append(d.req.Requests, item)
		d.pos = append(d.pos, i)
	}
	return d, nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// fieldError rewrites encoding/json's errors so that they name the field
// with its path, e.g. "requests[2].limit: want a number (int64), got string".
func fieldError(path string, err error) error {
	join := func(field string) string {
		switch {
		case path == "":
			return field
		case field == "":
			return path
		}
		return path + "." + field
	}
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return fmt.Errorf("%s: want %s, got %s", join(typeErr.Field), typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("%s: malformed JSON at byte %d: %v", join(""), syntaxErr.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s: malformed JSON: ends too early", join("body"))
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%s: empty, want a JSON object", join("body"))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return fmt.Errorf("%s: unknown field", join(field))
	}
	if path == "" {
		path = "body"
	}
	return fmt.Errorf("%s: %v", path, err)
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
