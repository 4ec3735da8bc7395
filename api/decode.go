package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

// decodeCheckRequest reads a POST /v1/check body from r, one token at a
// time: it holds one item's bytes beyond what it has decoded, and refuses
// the 1,001st item before reading it, so a body of many small items costs
// no more than a body of a thousand. It is as strict as protobuf on the
// gRPC side, where encoding/json is not: a repeated field, a field name in
// another case ("Key"), invalid UTF-8 or an escaped lone UTF-16 surrogate
// is an error. Malformed JSON, a wrong type, an unknown field or too many
// items is an error naming the field; an unknown enum name is the item's
// own error. An error of r (such as *http.MaxBytesError) is wrapped.
func decodeCheckRequest(r io.Reader) (decodedRequest, error) {
	dec := &decoder{Decoder: json.NewDecoder(r)}
	dec.UseNumber()
	d := decodedRequest{req: &pb.CheckRequest{}}
	err := readObject(dec, "", []string{"requests", "all"}, func(name string) error {
		if name == "all" {
			return readValue(dec, "", "all", &d.req.All, parseBool)
		}
		return d.readItems(dec)
	})
	if err != nil {
		return decodedRequest{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return decodedRequest{}, errors.New("body: unexpected data after the JSON value")
	}
	return d, nil
}

// decodedRequest is a parsed body: the items that parsed, and for those
// that parse as JSON but name an unknown enum, their errors by position.
type decodedRequest struct {
	req     *pb.CheckRequest
	itemErr map[int]error // position in the body -> error
	pos     []int         // position in the body of each item of req
}

func (d *decodedRequest) readItems(dec *decoder) error {
	if err := readDelim(dec, "requests", '['); err != nil {
		return err
	}
	for i := 0; dec.More(); i++ {
		if i == service.MaxItems {
			return fmt.Errorf("requests: more than %d items", service.MaxItems)
		}
		path := "requests[" + strconv.Itoa(i) + "]"
		var it checkItemJSON
		if err := readObject(dec, path, itemFields, func(name string) error { return it.read(dec, path, name) }); err != nil {
			return err
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
	return readDelim(dec, "requests", ']')
}

// read reads the value of the item's field name; path is the item's.
func (it *checkItemJSON) read(dec *decoder, path, name string) error {
	switch name {
	case "name":
		return readValue(dec, path, name, &it.Name, parseString)
	case "key":
		return readValue(dec, path, name, &it.Key, parseString)
	case "hits":
		return readValue(dec, path, name, &it.Hits, parseOptionalInt)
	case "limit":
		return readValue(dec, path, name, &it.Limit, parseInt)
	case "duration_ms":
		return readValue(dec, path, name, &it.DurationMs, parseInt)
	case "algorithm":
		return readValue(dec, path, name, &it.Algorithm, parseString)
	case "burst":
		return readValue(dec, path, name, &it.Burst, parseInt)
	case "behavior":
		return readValue(dec, path, name, &it.Behavior, parseString)
	case "reset":
		return readValue(dec, path, name, &it.Reset, parseBool)
	case "created_at_ms":
		return readValue(dec, path, name, &it.CreatedAtMs, parseInt)
	case "charge_refused":
		return readValue(dec, path, name, &it.ChargeRefused, parseBool)
	case "policy":
		return readValue(dec, path, name, &it.Policy, parseString)
	}
	return fmt.Errorf("%s: unknown field", joinPath(path, name)) // readObject lets only itemFields through
}

// readObject reads a JSON object, calling field for each of its names,
// which must be one of known, spelled exactly, and appear once; field reads
// the value.
func readObject(dec *decoder, path string, known []string, field func(name string) error) error {
	if err := readDelim(dec, path, '{'); err != nil {
		return err
	}
	var seen []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(path, err)
		}
		name, _ := tok.(string) // the decoder returns an object's names as strings
		switch {
		case !slices.Contains(known, name):
			for _, k := range known {
				if strings.EqualFold(k, name) {
					return fmt.Errorf("%s: unknown field (names are case-sensitive: %q)", joinPath(path, name), k)
				}
			}
			return fmt.Errorf("%s: unknown field", joinPath(path, name))
		case slices.Contains(seen, name):
			return fmt.Errorf("%s: repeated field", joinPath(path, name))
		}
		seen = append(seen, name)
		if err := field(name); err != nil {
			return err
		}
	}
	return readDelim(dec, path, '}')
}

// readDelim reads the next token, which must be want.
func readDelim(dec *decoder, path string, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return jsonError(path, err)
	}
	if tok != want {
		kinds := map[json.Delim]string{'{': "an object", '[': "an array", '}': "the object's end", ']': "the array's end"}
		return fmt.Errorf("%s: want %s, got %s", joinPath(path, ""), kinds[want], tokenKind(tok))
	}
	return nil
}

// decoder is a json.Decoder with a buffer for one value, reused from
// value to value.
type decoder struct {
	*json.Decoder
	raw json.RawMessage
}

// readValue reads the value of the field name of the object at path and
// parses it into dst; null leaves dst as it is, as encoding/json does.
func readValue[T any](dec *decoder, path, name string, dst *T, parse func(raw []byte, dst *T) error) error {
	if err := dec.Decode(&dec.raw); err != nil {
		return jsonError(joinPath(path, name), err)
	}
	if string(dec.raw) == "null" {
		return nil
	}
	if err := parse(dec.raw, dst); err != nil {
		return fmt.Errorf("%s: %w", joinPath(path, name), err)
	}
	return nil
}

func parseInt(raw []byte, dst *int64) error {
	if kind := rawKind(raw); kind != "number" {
		return fmt.Errorf("want int64, got %s", kind)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return fmt.Errorf("want int64, got number %.40s", raw)
	}
	*dst = n
	return nil
}

func parseOptionalInt(raw []byte, dst **int64) error {
	n := new(int64)
	if err := parseInt(raw, n); err != nil {
		return err
	}
	*dst = n
	return nil
}

func parseBool(raw []byte, dst *bool) error {
	if kind := rawKind(raw); kind != "bool" {
		return fmt.Errorf("want bool, got %s", kind)
	}
	*dst = raw[0] == 't'
	return nil
}

func parseString(raw []byte, dst *string) error {
	if kind := rawKind(raw); kind != "string" {
		return fmt.Errorf("want string, got %s", kind)
	}
	s, err := unquote(raw)
	if err != nil {
		return err
	}
	*dst = s
	return nil
}

// unquote decodes a JSON string whose syntax the decoder has checked.
// encoding/json would replace invalid UTF-8 and escaped lone surrogates
// with U+FFFD, so that two different keys could name one counter; unquote
// refuses them, as protobuf refuses invalid UTF-8.
func unquote(raw []byte) (string, error) {
	s := raw[1 : len(raw)-1]
	if !utf8.Valid(s) {
		return "", errors.New("invalid UTF-8")
	}
	if bytes.IndexByte(s, '\\') < 0 {
		return string(s), nil
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
				return "", errors.New("invalid UTF-16: a lone surrogate escape")
			}
			if r = utf16.DecodeRune(r, hex4(s[i+2:i+6])); r == utf8.RuneError {
				return "", errors.New("invalid UTF-16: a lone surrogate escape")
			}
			i += 6
		}
		b = utf8.AppendRune(b, r)
	}
	return string(b), nil
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

// hex4 decodes four hex digits, which the decoder has checked.
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

// rawKind names the kind of a JSON value by its first byte.
func rawKind(raw []byte) string {
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// tokenKind names the kind of a token of json.Decoder.Token.
func tokenKind(tok json.Token) string {
	switch tok := tok.(type) {
	case json.Delim:
		return map[json.Delim]string{'{': "object", '[': "array", '}': "'}'", ']': "']'"}[tok]
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}

func joinPath(path, field string) string {
	switch {
	case path == "" && field == "":
		return "body"
	case path == "":
		return field
	case field == "":
		return path
	}
	return path + "." + field
}

// jsonError names the place of a decoder's error: malformed JSON, a body
// that ends early, or the reader's own error (wrapped).
func jsonError(path string, err error) error {
	at := joinPath(path, "")
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("%s: malformed JSON at byte %d: %v", at, syntaxErr.Offset, err)
	case err == io.EOF && path == "":
		return errors.New("body: empty, want a JSON object")
	case err == io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s: malformed JSON: ends too early", at)
	}
	return fmt.Errorf("%s: %w", at, err)
}
