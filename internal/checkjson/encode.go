package checkjson

import (
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// The JSON answer of POST /v1/check: snake_case keys, JSON numbers, enums
// by name, written out here rather than produced by protojson (which would
// print 64-bit numbers as strings) or by encoding/json (which spends most
// of its time in reflection). The bytes are exactly what encoding/json
// writes for the structs in checkjson_test.go, which pin the shape:
//
//	{"responses":[{"status":"UNDER_LIMIT","limit":10,"remaining":9,"reset_time_ms":1,
//	  "retry_after_ms":0,"delay_ms":0,"admits_one":true,"borrowed":true,"reservation_id":"...","error":"...","error_code":"...","metadata":{...}}]}
//
// with borrowed, reservation_id, error, error_code and metadata left out
// when empty, and admits_one written only for a peek (an item of hits 0)
// that has no error: whether a check of 1 would be admitted now.

// AppendResponse appends the answer to d to b: resp's results (one per
// item of d.Request) back at their body positions, next to the items that
// failed to parse, and a newline.
func AppendResponse(b []byte, d Body, resp *pb.CheckResponse) []byte {
	b = append(b, `{"responses":[`...)
	results, errs, items := resp.GetResponses(), d.itemErr, d.Request.GetRequests()
	for p := range len(d.pos) + len(d.itemErr) {
		if p > 0 {
			b = append(b, ',')
		}
		if len(errs) > 0 && errs[0].pos == p {
			b = appendItemError(b, errs[0].err)
			errs = errs[1:]
			continue
		}
		var (
			r    *pb.CheckResult
			peek bool
		)
		if len(results) > 0 {
			r, results = results[0], results[1:]
		}
		if len(items) > 0 {
			peek = items[0].Hits != nil && *items[0].Hits == 0
			items = items[1:]
		}
		b = appendResult(b, r, peek)
	}
	return append(b, "]}\n"...)
}

// appendResult appends the JSON of one result (nil as the zero result),
// the answer to a peek if peek.
func appendResult(b []byte, r *pb.CheckResult, peek bool) []byte {
	b = append(b, `{"status":"`...)
	b = append(b, r.GetStatus().String()...)
	b = append(b, `","limit":`...)
	b = strconv.AppendInt(b, r.GetLimit(), 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, r.GetRemaining(), 10)
	b = append(b, `,"reset_time_ms":`...)
	b = strconv.AppendInt(b, r.GetResetTimeMs(), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, r.GetRetryAfterMs(), 10)
	b = append(b, `,"delay_ms":`...)
	b = strconv.AppendInt(b, r.GetDelayMs(), 10)
	if peek && r.GetError() == "" {
		b = append(b, `,"admits_one":`...)
		b = strconv.AppendBool(b, checks.AdmitsOne(r.GetStatus() == pb.Status_UNDER_LIMIT, r.GetRemaining()))
	}
	if r.GetBorrowed() {
		b = append(b, `,"borrowed":true`...)
	}
	if id := r.GetReservationId(); id != "" {
		b = append(b, `,"reservation_id":`...)
		b = appendString(b, id)
	}
	if r.GetError() != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, r.GetError())
	}
	if r.GetErrorCode() != pb.ErrorCode_OK {
		b = append(b, `,"error_code":"`...)
		b = append(b, r.GetErrorCode().String()...)
		b = append(b, '"')
	}
	if md := r.GetMetadata(); len(md) > 0 {
		b = append(b, `,"metadata":{`...)
		for i, k := range slices.Sorted(maps.Keys(md)) { // encoding/json sorts a map's keys
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, md[k])
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendItemError appends the result of an item that parsed as JSON but
// not as a check: refused, with its error.
func appendItemError(b []byte, err error) []byte {
	b = append(b, `{"status":"`...)
	b = append(b, pb.Status_OVER_LIMIT.String()...)
	b = append(b, `","limit":0,"remaining":0,"reset_time_ms":0,"retry_after_ms":-1,"delay_ms":0,"error":`...)
	b = appendString(b, err.Error())
	b = append(b, `,"error_code":"`...)
	b = append(b, pb.ErrorCode_INVALID_ARGUMENT.String()...)
	return append(b, `"}`...)
}

// appendString appends s as a JSON string, escaped as encoding/json
// escapes it: '"', '\\' and control characters; '<', '>' and '&', so that
// the answer is safe to embed in HTML; U+2028 and U+2029, which
// JavaScript takes for line ends; and each byte of invalid UTF-8 as
// U+FFFD, so that the answer is valid UTF-8 whatever s holds.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0 // s[start:i] is still to append, as it is
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
