package checkjson

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// scanner reads JSON from a stream, one token at a time, checking its
// syntax as strictly as encoding/json does. It holds one token beyond what
// its caller has consumed (a buffer of 4 KiB, more only for a longer
// token), and builds nothing: a string token is a slice of its buffer,
// valid until the next read. The caller supplies the structure (which
// names an object may have, which values they take) and reports each error
// at a loc, so that it names the field.
type scanner struct {
	r        io.Reader
	buf      []byte // buf[pos:end] has been read and not consumed
	pos, end int
	base     int64 // body bytes before buf[0]
	err      error // the reader's error, once seen: io.EOF at the end
}

func newScanner(r io.Reader) *scanner {
	return &scanner{r: r, buf: make([]byte, 4<<10)}
}

// loc is a place in a check request: a field of the body (item < 0), or a
// field of the item at position item, a path such as "parent.key" inside
// an object of the item; field "" is the body, or the item, itself. It is
// formatted only for an error.
type loc struct {
	item  int
	field string
}

func (l loc) String() string {
	switch {
	case l.item < 0 && l.field == "":
		return "body"
	case l.item < 0:
		return l.field
	case l.field == "":
		return "requests[" + strconv.Itoa(l.item) + "]"
	}
	return "requests[" + strconv.Itoa(l.item) + "]." + l.field
}

// at is the loc of l's field named field: of the body or the item, or of
// the object at l inside an item.
func (l loc) at(field string) loc {
	if l.field != "" {
		field = l.field + "." + field
	}
	return loc{item: l.item, field: field}
}

// fill reads more of the body, keeping buf[keep:], which it may move to
// the start of buf; it returns how far it moved them and whether it read
// anything. The buffer grows only when buf[keep:] fills it, so it holds at
// most one token (and a read) besides what the caller has consumed.
func (s *scanner) fill(keep int) (shift int, ok bool) {
	if s.err != nil {
		return 0, false
	}
	if keep > 0 {
		copy(s.buf, s.buf[keep:s.end])
		s.end -= keep
		s.pos -= keep
		s.base += int64(keep)
	}
	if s.end == len(s.buf) {
		s.buf = append(s.buf, make([]byte, len(s.buf))...)
	}
	for range 100 { // as bufio does: a reader that returns nothing for long is broken
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err != nil {
			s.err = err
		}
		if n > 0 || err != nil {
			return keep, n > 0
		}
	}
	s.err = io.ErrNoProgress
	return keep, false
}

// ended is the error for a body that ended, or failed, inside the value
// at l.
func (s *scanner) ended(l loc) error {
	if s.err == io.EOF {
		return fmt.Errorf("%s: malformed JSON: ends too early", l)
	}
	return fmt.Errorf("%s: %w", l, s.err)
}

// syntaxError is malformed JSON at buf[i], found while reading the value
// at l.
func (s *scanner) syntaxError(l loc, i int, context string) error {
	return fmt.Errorf("%s: malformed JSON at byte %d: invalid character %s %s", l, s.base+int64(i)+1, quoteChar(s.buf[i]), context)
}

func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}

// next skips white space and returns the next byte, without consuming it.
func (s *scanner) next(l loc) (byte, error) {
	for {
		for ; s.pos < s.end; s.pos++ {
			switch c := s.buf[s.pos]; c {
			case ' ', '\t', '\n', '\r':
			default:
				return c, nil
			}
		}
		if _, ok := s.fill(s.pos); !ok {
			return 0, s.ended(l)
		}
	}
}

// kinds names the kind of a value, or of an unexpected delimiter, by its
// first byte.
func kindOf(c byte) string {
	switch c {
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
	case '}':
		return "'}'"
	case ']':
		return "']'"
	}
	return "number"
}

// enter consumes the opening delimiter open ('{' or '[') of the value at
// l, and its closing delimiter close too if nothing comes between them,
// reporting whether it did.
func (s *scanner) enter(l loc, open, close byte) (empty bool, err error) {
	c, err := s.next(l)
	if err != nil {
		return false, err
	}
	if c != open {
		if !startsValue(c) && c != '}' && c != ']' {
			return false, s.syntaxError(l, s.pos, "looking for beginning of value")
		}
		what := "an object"
		if open == '[' {
			what = "an array"
		}
		return false, fmt.Errorf("%s: want %s, got %s", l, what, kindOf(c))
	}
	s.pos++
	if c, err = s.next(l); err != nil || c != close {
		return false, err
	}
	s.pos++
	return true, nil
}

func startsValue(c byte) bool {
	switch c {
	case '"', '{', '[', 't', 'f', 'n', '-':
		return true
	}
	return '0' <= c && c <= '9'
}

// after consumes the ',' or the closing delimiter close that follows an
// element of the object or array at l, and reports whether it was the
// close.
func (s *scanner) after(l loc, close byte, context string) (done bool, err error) {
	c, err := s.next(l)
	if err != nil {
		return false, err
	}
	if c != ',' && c != close {
		return false, s.syntaxError(l, s.pos, context)
	}
	s.pos++
	return c == close, nil
}

// object reads the object at l. Each of its names must be one of known,
// spelled exactly, and appear once (known has at most 32 names); value
// reads the value of known[i].
func (s *scanner) object(l loc, known []string, value func(i int) error) error {
	if empty, err := s.enter(l, '{', '}'); empty || err != nil {
		return err
	}
	var seen uint32
	for {
		c, err := s.next(l)
		if err != nil {
			return err
		}
		if c != '"' {
			return s.syntaxError(l, s.pos, "looking for beginning of object key string")
		}
		name, err := s.str(l)
		if err != nil {
			return err
		}
		if decoded, err := decodeText(name); err == nil { // escapes stand for what they escape
			name = decoded
		}
		i := fieldIndex(known, name)
		if i < 0 {
			return unknownField(l.at(string(name)), known)
		}
		if seen&(1<<i) != 0 {
			return fmt.Errorf("%s: repeated field", l.at(known[i]))
		}
		seen |= 1 << i
		if c, err := s.next(l); err != nil {
			return err
		} else if c != ':' {
			return s.syntaxError(l, s.pos, "after object key")
		}
		s.pos++
		if err := value(i); err != nil {
			return err
		}
		if done, err := s.after(l, '}', "after object key:value pair"); done || err != nil {
			return err
		}
	}
}

func fieldIndex(known []string, name []byte) int {
	for i, k := range known {
		if k == string(name) {
			return i
		}
	}
	return -1
}

func unknownField(l loc, known []string) error {
	for _, k := range known {
		if strings.EqualFold(k, l.field) {
			return &unknownFieldError{l, fmt.Sprintf("%s: unknown field (names are case-sensitive: %q)", l, k)}
		}
	}
	return &unknownFieldError{l, fmt.Sprintf("%s: unknown field", l)}
}

// unknownFieldError is the error of a field name that its object does
// not have, at where.
type unknownFieldError struct {
	where loc
	msg   string
}

func (e *unknownFieldError) Error() string { return e.msg }

// array reads the array at l; elem reads its ith element, and is called
// before anything of it is read.
func (s *scanner) array(l loc, elem func(i int) error) error {
	if empty, err := s.enter(l, '[', ']'); empty || err != nil {
		return err
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		if done, err := s.after(l, ']', "after array element"); done || err != nil {
			return err
		}
	}
}

// scalar reads the value at l, which must be a string, number, bool or
// null, and returns its first byte and its text: a string's contents
// between its quotes, the literal otherwise. An object or array is left unread, returned as its first
// byte alone: the callers take none, and refuse it.
func (s *scanner) scalar(l loc) (kind byte, text []byte, err error) {
	c, err := s.next(l)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case c == '"':
		text, err = s.str(l)
	case c == '{' || c == '[':
	case c == '-' || '0' <= c && c <= '9':
		text, err = s.number(l)
	case c == 't' || c == 'f' || c == 'n':
		text, err = s.literal(l)
	default:
		err = s.syntaxError(l, s.pos, "looking for beginning of value")
	}
	return c, text, err
}

// str reads the string at s.pos and returns its contents between the
// quotes, checked for JSON syntax.
func (s *scanner) str(l loc) ([]byte, error) {
	start, i := s.pos, s.pos+1
	for {
		for i < s.end {
			c := s.buf[i]
			switch {
			case c == '"':
				s.pos = i + 1
				return s.buf[start+1 : i], nil
			case c < 0x20:
				return nil, s.syntaxError(l, i, "in string literal")
			case c != '\\':
				i++
				continue
			}
			n, ok := escapeLen(s.buf[i+1 : s.end])
			if !ok {
				return nil, s.syntaxError(l, i+n+1, "in string escape code")
			}
			if n == 0 { // the escape goes on past the buffer
				break
			}
			i += 1 + n
		}
		shift, ok := s.fill(start)
		if !ok {
			return nil, s.ended(l)
		}
		start -= shift
		i -= shift
	}
}

// escapeLen returns the length of the escape whose text after the
// backslash begins b, 0 if b is too short to tell, or the offset of a bad
// byte in b and false.
func escapeLen(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, true
	}
	switch b[0] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 1, true
	case 'u':
		for j := 1; j < 5; j++ {
			if j == len(b) {
				return 0, true
			}
			if !isHex(b[j]) {
				return j, false
			}
		}
		return 5, true
	}
	return 0, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// number reads the number at s.pos.
func (s *scanner) number(l loc) ([]byte, error) {
	text, err := s.word(l, func(c byte) bool {
		return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
	})
	if err == nil && !validNumber(text) {
		err = fmt.Errorf("%s: malformed JSON at byte %d: invalid number literal %.40q", l, s.base+int64(s.pos), text)
	}
	return text, err
}

// literal reads the true, false or null at s.pos.
func (s *scanner) literal(l loc) ([]byte, error) {
	text, err := s.word(l, func(c byte) bool { return 'a' <= c && c <= 'z' })
	if err == nil {
		switch string(text) {
		case "true", "false", "null":
		default:
			err = fmt.Errorf("%s: malformed JSON at byte %d: invalid literal %.40q", l, s.base+int64(s.pos), text)
		}
	}
	return text, err
}

// word reads the bytes from s.pos that satisfy in. A word ends at a byte
// that is not in it, or at the end of the body.
func (s *scanner) word(l loc, in func(byte) bool) ([]byte, error) {
	start, i := s.pos, s.pos
	for {
		for ; i < s.end; i++ {
			if !in(s.buf[i]) {
				s.pos = i
				return s.buf[start:i], nil
			}
		}
		shift, ok := s.fill(start)
		start -= shift
		i -= shift
		if !ok {
			if s.err != io.EOF {
				return nil, s.ended(l)
			}
			s.pos = i
			return s.buf[start:i], nil
		}
	}
}

// validNumber reports whether b is a JSON number:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(b []byte) bool {
	digits := func(b []byte) ([]byte, bool) {
		n := 0
		for n < len(b) && '0' <= b[n] && b[n] <= '9' {
			n++
		}
		return b[n:], n > 0
	}
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 {
		return false
	}
	var ok bool
	if b[0] == '0' {
		b = b[1:]
	} else if b, ok = digits(b); !ok {
		return false
	}
	if len(b) > 0 && b[0] == '.' {
		if b, ok = digits(b[1:]); !ok {
			return false
		}
	}
	if len(b) > 0 && (b[0] == 'e' || b[0] == 'E') {
		b = b[1:]
		if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
			b = b[1:]
		}
		if b, ok = digits(b); !ok {
			return false
		}
	}
	return len(b) == 0
}
