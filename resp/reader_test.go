package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// encode is a command as clients send it: an array of bulk strings.
func encode(args ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.Bytes()
}

func TestReaderInlineAndArrays(t *testing.T) {
	in := string(encode("CL.THROTTLE", "k", "1", "2", "3")) + "  \r\nPING  hello\tthere\r\n" + string(encode("x\r\ny"))
	r := NewReader(strings.NewReader(in), DefaultLimits())
	want := [][]string{{"CL.THROTTLE", "k", "1", "2", "3"}, {"PING", "hello", "there"}, {"x\r\ny"}}
	for i, w := range want {
		args, err := r.Next()
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if got := strs(args); fmt.Sprintf("%q", got) != fmt.Sprintf("%q", w) {
			t.Errorf("command %d: %q, want %q", i, got, w)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last command: %v, want EOF", err)
	}
}

func TestReaderCutCommandIsUnexpectedEOF(t *testing.T) {
	full := encode("PING", "abc")
	for n := 1; n < len(full); n++ {
		_, err := NewReader(bytes.NewReader(full[:n]), DefaultLimits()).Next()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: %v, want io.ErrUnexpectedEOF", full[:n], err)
		}
	}
}

func strs(args [][]byte) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = string(a)
	}
	return out
}

// FuzzReader decodes arbitrary bytes under small limits: it never panics,
// never returns a command beyond the limits, and decodes what it encodes.
func FuzzReader(f *testing.F) {
	f.Add(encode("CL.THROTTLE", "user123", "15", "30", "60"), []byte("PING\r\n"))
	f.Add([]byte("*2\r\n$4\r\nPING\r\n$536870912\r\n"), []byte("x"))
	f.Add([]byte("*-1\r\n*1\r\n$0\r\n\r\n"), []byte("\r\n"))
	f.Add([]byte(strings.Repeat("A", 300)+"\r\n"), []byte("\x00"))
	f.Add([]byte("PING\r\nPOST /v1/check HTTP/1.1\r\nHost: x\r\n\r\n"), []byte("HTTP/1.1"))
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"), []byte("*"))
	lim := Limits{MaxArgs: 4, MaxBulk: 16, MaxCommand: 40, MaxInline: 64, Buffer: 64}
	f.Fuzz(func(t *testing.T, in, arg []byte) {
		r := NewReader(bytes.NewReader(in), lim)
		for {
			args, err := r.Next()
			if err != nil {
				var pe *ProtocolError
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &pe) {
					t.Fatalf("error %v is neither the input's end nor a protocol error", err)
				}
				break
			}
			total := 0
			for _, a := range args {
				if len(a) > lim.MaxBulk {
					t.Fatalf("argument of %d bytes, bound %d", len(a), lim.MaxBulk)
				}
				total += len(a)
			}
			if len(args) == 0 || len(args) > lim.MaxArgs || total > max(lim.MaxCommand, lim.MaxInline) {
				t.Fatalf("command of %d arguments, %d bytes", len(args), total)
			}
		}
		// Round trip: what a client encodes within the limits decodes as it was.
		if len(arg) == 0 || len(arg) > lim.MaxBulk {
			return
		}
		cmd := []string{"PING", string(arg)}
		got, err := NewReader(bytes.NewReader(encode(cmd...)), lim).Next()
		if err != nil || fmt.Sprintf("%q", strs(got)) != fmt.Sprintf("%q", cmd) {
			t.Fatalf("decoded %q, %v; want %q", strs(got), err, cmd)
		}
	})
}

// BenchmarkReaderThrottle decodes pipelined CL.THROTTLE commands: the
// decoder allocates nothing once warm.
func BenchmarkReaderThrottle(b *testing.B) {
	cmd := encode("CL.THROTTLE", "user:42", "15", "30", "60", "1")
	in := bytes.Repeat(cmd, 100)
	src := bytes.NewReader(in)
	r := NewReader(src, DefaultLimits())
	b.ReportAllocs()
	b.SetBytes(int64(len(cmd)))
	for i := 0; b.Loop(); i++ {
		if i%100 == 0 {
			src.Reset(in)
		}
		if _, err := r.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestReaderDoesNotAllocate(t *testing.T) {
	cmd := encode("CL.THROTTLE", "user:42", "15", "30", "60", "1")
	src := bytes.NewReader(nil)
	r := NewReader(src, DefaultLimits())
	r.Next() // grows the arena once
	if n := testing.AllocsPerRun(100, func() {
		src.Reset(cmd)
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Next allocates %v times per command, want 0", n)
	}
}
