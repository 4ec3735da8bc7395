// Package checkjson is the JSON form of a check request and its answer,
// as POST /v1/check takes and gives them: Decode reads a body into a
// CheckRequest, AppendResponse writes the answer. Both are written out
// by hand rather than left to encoding/json or protojson: the decoder
// reads the body as it arrives, holding one token beyond what it has
// decoded and refusing the 1,001st item before reading it, and is as
// strict as protobuf on the gRPC side; the encoder writes JSON numbers
// (protojson would write 64-bit numbers as strings) without reflection.
// Tests pin both to encoding/json's reading and writing of the shapes in
// docs/checks.md, and fuzz targets hold them to it.
package checkjson

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// Decode reads a POST /v1/check body from r as it arrives, straight into
// protobuf items: it holds one token beyond what it has
// decoded (see scanner), and refuses the 1,001st item before reading it,
// so a body of many small items costs no more than a body of a thousand.
// It is as strict as protobuf on the gRPC side, where encoding/json is
// not: a repeated field, a field name in another case ("Key"), invalid
// UTF-8 or an escaped lone UTF-16 surrogate is an error. Malformed JSON, a
// wrong type, an unknown field or too many items is an error naming the
// field; an unknown enum name is the item's own error. An error of r (such
// as *http.MaxBytesError) is wrapped.
func Decode(r io.Reader) (Body, error) {
	s := newScanner(r)
	top := loc{item: -1}
	if _, err := s.next(top); err != nil {
		if s.err == io.EOF {
			return Body{}, errors.New("body: empty, want a JSON object")
		}
		return Body{}, err
	}
	d := Body{Request: &pb.CheckRequest{}}
	err := s.object(top, bodyFields, func(i int) error {
		if bodyFields[i] == "all" {
			return readBool(s, top.at("all"), &d.Request.All)
		}
		return d.readItems(s)
	})
	var unknown *unknownFieldError
	if errors.As(err, &unknown) && unknown.where.item < 0 &&
		slices.ContainsFunc(itemFields, func(f string) bool { return strings.EqualFold(f, unknown.where.field) }) {
		// A check sent alone, as an item is written.
		return Body{}, fmt.Errorf(`%w: a check is an item of the list "requests"; wrap it: {"requests":[...]}`, err)
	}
	if err != nil {
		return Body{}, err
	}
	if _, err := s.next(top); err == nil {
		return Body{}, errors.New("body: unexpected data after the JSON value")
	} else if s.err != io.EOF {
		return Body{}, err
	}
	return d, nil
}

// bodyFields and itemFields are the field names of a request body and of
// one of its items, exactly as they must be spelled.
var (
	bodyFields = []string{"requests", "all"}
	itemFields = []string{"name", "key", "hits", "limit", "duration_ms", "algorithm", "burst",
		"behavior", "reset", "created_at_ms", "charge_refused", "policy", "min_interval_ms", "ceiling", "parent", "reserve_ttl_ms"}
	parentFields = []string{"key", "limit", "duration_ms"}
)

// Body is a decoded body: the request of the items that parsed, and for
// those that parse as JSON but name an unknown enum, their errors, in
// body order. AppendResponse puts the answers to Request and those errors
// back at their body positions.
type Body struct {
	Request *pb.CheckRequest
	itemErr []itemError
	pos     []int // position in the body of each item of Request
}

// itemError is the error of the item at position pos in the body.
type itemError struct {
	pos int
	err error
}

func (d *Body) readItems(s *scanner) error {
	var (
		// Items are allocated a slab at a time (8, then as many as
		// there are so far), not one by one; one that outlives the
		// request (a forward in flight) keeps its slab alive meanwhile.
		free         []pb.CheckItem
		name, policy string // the last ones read, shared by the items that repeat them
	)
	return s.array(loc{item: -1, field: "requests"}, func(i int) error {
		if i == checks.MaxItems {
			return fmt.Errorf("requests: more than %d items", checks.MaxItems)
		}
		if len(free) == 0 {
			free = make([]pb.CheckItem, min(max(i, 8), checks.MaxItems-i))
			d.Request.Requests = slices.Grow(d.Request.Requests, len(free))
			d.pos = slices.Grow(d.pos, len(free))
		}
		item := &free[0]
		r := itemReader{s: s, item: item, name: &name, policy: &policy}
		l := loc{item: i}
		if err := s.object(l, itemFields, func(f int) error { return r.read(l.at(itemFields[f]), f) }); err != nil {
			return err
		}
		free = free[1:]
		if err := cmp.Or(r.algorithmErr, r.behaviorErr); err != nil {
			d.itemErr = append(d.itemErr, itemError{i, err})
			return nil
		}
		d.Request.Requests = append(d.Request.Requests, item)
		d.pos = append(d.pos, i)
		return nil
	})
}

// itemReader reads the fields of one item into item. An unknown enum name
// is kept aside, for the item's own error once the item is read: it is not
// an error of the body.
type itemReader struct {
	s                         *scanner
	item                      *pb.CheckItem
	name, policy              *string
	algorithmErr, behaviorErr error
}

// read reads the value at l of the item's field itemFields[f].
func (r *itemReader) read(l loc, f int) error {
	s, it := r.s, r.item
	switch itemFields[f] {
	case "name":
		return readString(s, l, &it.Name, r.name)
	case "key":
		return readString(s, l, &it.Key, nil)
	case "policy":
		return readString(s, l, &it.Policy, r.policy)
	case "hits":
		return readOptionalInt(s, l, &it.Hits)
	case "reserve_ttl_ms":
		return readOptionalInt(s, l, &it.ReserveTtlMs)
	case "limit":
		_, err := readInt(s, l, &it.Limit)
		return err
	case "duration_ms":
		_, err := readInt(s, l, &it.DurationMs)
		return err
	case "burst":
		_, err := readInt(s, l, &it.Burst)
		return err
	case "created_at_ms":
		_, err := readInt(s, l, &it.CreatedAtMs)
		return err
	case "min_interval_ms":
		_, err := readInt(s, l, &it.MinIntervalMs)
		return err
	case "ceiling":
		_, err := readInt(s, l, &it.Ceiling)
		return err
	case "parent":
		return readParent(s, l, &it.Parent)
	case "reset":
		return readBool(s, l, &it.Reset_)
	case "charge_refused":
		return readBool(s, l, &it.ChargeRefused)
	case "algorithm":
		text, err := readText(s, l)
		if err != nil || len(text) == 0 {
			return err
		}
		a, ok := pb.Algorithm_value[string(text)]
		if !ok { // not spelled as the enum: ParseKind ignores case
			k, err := algorithms.ParseKind(string(text))
			if err != nil {
				r.algorithmErr = &checks.FieldError{Field: "algorithm", Reason: err.Error()}
				return nil
			}
			a = int32(k)
		}
		it.Algorithm = pb.Algorithm(a)
		return nil
	case "behavior":
		text, err := readText(s, l)
		if err != nil || len(text) == 0 {
			return err
		}
		b, ok := pb.Behavior_value[string(text)]
		if !ok {
			if b, ok = pb.Behavior_value[strings.ToUpper(string(text))]; !ok {
				r.behaviorErr = &checks.FieldError{Field: "behavior", Reason: fmt.Sprintf("unknown behavior %q (want BATCHED, UNBATCHED, GLOBAL or LOCAL)", text)}
				return nil
			}
		}
		it.Behavior = pb.Behavior(b)
		return nil
	}
	return fmt.Errorf("%s: unknown field", l) // object lets only itemFields through
}

// readParent reads the parent object at l into dst; null leaves dst as it
// is, as encoding/json does.
func readParent(s *scanner, l loc, dst **pb.ParentLimit) error {
	if c, err := s.next(l); err != nil {
		return err
	} else if c == 'n' {
		_, err := readText(s, l) // null, or malformed
		return err
	}
	p := &pb.ParentLimit{}
	err := s.object(l, parentFields, func(i int) error {
		fl := l.at(parentFields[i])
		switch parentFields[i] {
		case "key":
			return readString(s, fl, &p.Key, nil)
		case "limit":
			_, err := readInt(s, fl, &p.Limit)
			return err
		}
		_, err := readInt(s, fl, &p.DurationMs)
		return err
	})
	if err == nil {
		*dst = p
	}
	return err
}

// readText reads the string at l, decoded and checked; it is valid until
// the next read, and nil for null.
func readText(s *scanner, l loc) ([]byte, error) {
	kind, text, err := s.scalar(l)
	switch {
	case err != nil:
		return nil, err
	case kind == 'n':
		return nil, nil
	case kind != '"':
		return nil, fmt.Errorf("%s: want string, got %s", l, kindOf(kind))
	}
	if text, err = decodeText(text); err != nil {
		return nil, fmt.Errorf("%s: %w", l, err)
	}
	return text, nil
}

// readString reads the string at l into dst; null leaves dst as it is, as
// encoding/json does. If last is not nil, it is the string read last into
// this field of another item, which dst shares if it is the same.
func readString(s *scanner, l loc, dst, last *string) error {
	text, err := readText(s, l)
	switch {
	case err != nil || text == nil:
		return err
	case last != nil && string(text) == *last:
		*dst = *last
	default:
		*dst = string(text)
		if last != nil {
			*last = *dst
		}
	}
	return nil
}

// readInt reads the integer at l into dst, and reports whether it was
// null, which leaves dst as it is.
func readInt(s *scanner, l loc, dst *int64) (isNull bool, err error) {
	kind, text, err := s.scalar(l)
	switch {
	case err != nil:
		return false, err
	case kind == 'n':
		return true, nil
	case kind == '"' || kind == '{' || kind == '[' || kind == 't' || kind == 'f':
		return false, fmt.Errorf("%s: want int64, got %s", l, kindOf(kind))
	}
	n, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return false, fmt.Errorf("%s: want int64, got number %.40s", l, text)
	}
	*dst = n
	return false, nil
}

// readBool reads the bool at l into dst; null leaves dst as it is.
func readBool(s *scanner, l loc, dst *bool) error {
	kind, _, err := s.scalar(l)
	switch {
	case err != nil || kind == 'n':
		return err
	case kind != 't' && kind != 'f':
		return fmt.Errorf("%s: want bool, got %s", l, kindOf(kind))
	}
	*dst = kind == 't'
	return nil
}

// decodeText decodes the contents s of a JSON string, whose syntax the
// scanner has checked: s itself if it holds no escapes, a new slice if it
// does. encoding/json would replace invalid UTF-8 and escaped lone
// surrogates with U+FFFD, so that two different keys could name one
// counter; decodeText refuses them, as protobuf refuses invalid UTF-8.
func decodeText(s []byte) ([]byte, error) {
	if !utf8.Valid(s) {
		return nil, errors.New("invalid UTF-8")
	}
	if bytes.IndexByte(s, '\\') < 0 {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b = append(b, s[i])
			i++
			continue
		}
		if s[i+1] != 'u' {
			b = append(b, unescape(s[i+1]))
			i += 2
			continue
		}
		r := hex4(s[i+2 : i+6])
		i += 6
		if utf16.IsSurrogate(r) {
			if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
				return nil, errors.New("invalid UTF-16: a lone surrogate escape")
			}
			if r = utf16.DecodeRune(r, hex4(s[i+2:i+6])); r == utf8.RuneError {
				return nil, errors.New("invalid UTF-16: a lone surrogate escape")
			}
			i += 6
		}
		b = utf8.AppendRune(b, r)
	}
	return b, nil
}

// unescape returns the byte a one-letter JSON escape stands for.
func unescape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\' and '/' stand for themselves
}

// hex4 decodes four hex digits, which the scanner has checked.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= 'a':
			c -= 'a' - 10
		case c >= 'A':
			c -= 'A' - 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// readOptionalInt reads an optional integer field: null leaves it absent.
func readOptionalInt(s *scanner, l loc, field **int64) error {
	var n int64
	if isNull, err := readInt(s, l, &n); err != nil || isNull {
		return err
	}
	*field = &n
	return nil
}
