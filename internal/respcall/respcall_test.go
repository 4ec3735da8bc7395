package respcall

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePort accepts connections on loopback and hands each command's
// payload to answer, writing back what it returns; answer may close the
// connection instead (nil, false).
type fakePort struct {
	lis    net.Listener
	answer func(payload []byte) (out []byte, keep bool)
	// closeIdle closes each connection after its answer, while the
	// client holds it idle: as a node's idle timeout does.
	closeIdle atomic.Bool
}

func startPort(t *testing.T, answer func([]byte) ([]byte, bool)) *fakePort {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePort{lis: lis, answer: answer}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := lis.Accept()
			if err != nil {
				return
			}
			go f.serve(nc)
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return f
}

// serve reads commands of RL.CHECK as the client writes them.
func (f *fakePort) serve(nc net.Conn) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	for {
		var n int
		if _, err := fmt.Fscanf(br, "*2\r\n$8\r\nRL.CHECK\r\n$%d\r\n", &n); err != nil {
			return
		}
		payload := make([]byte, n+2)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		out, keep := f.answer(payload[:n])
		if !keep {
			return
		}
		if _, err := nc.Write(out); err != nil || f.closeIdle.Load() {
			return
		}
	}
}

func bulk(b []byte) []byte { return fmt.Appendf(nil, "$%d\r\n%s\r\n", len(b), b) }

// echo answers each payload with itself.
func echo(p []byte) ([]byte, bool) { return bulk(p), true }

// ready returns a pool of addr with one connection dialled: the first
// call is refused while it connects.
func ready(t *testing.T, addr string, max int) *Pool {
	t.Helper()
	p := New(addr, max)
	t.Cleanup(p.Close)
	if err := p.Call(context.Background(), []byte("x"), nil); !errors.Is(err, ErrRefused) {
		t.Fatalf("first call: %v, want refused while connecting", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.idle)
		p.mu.Unlock()
		if n > 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// call calls p and returns the answer's payload.
func call(ctx context.Context, p *Pool, payload string) (string, error) {
	var got string
	err := p.Call(ctx, []byte(payload), func(a []byte) error { got = string(a); return nil })
	return got, err
}

func TestCallsAnswerOnTheirConnection(t *testing.T) {
	f := startPort(t, echo)
	p := ready(t, f.lis.Addr().String(), 1)
	for i := range 3 {
		want := strings.Repeat("ab\r\n", i+1)
		if got, err := call(context.Background(), p, want); err != nil || got != want {
			t.Fatalf("call %d: %q, %v; want %q", i, got, err, want)
		}
	}
	// Its one connection busy, a call is refused, not queued.
	p.mu.Lock()
	c := p.idle[0]
	p.idle = p.idle[:0]
	p.mu.Unlock()
	if _, err := call(context.Background(), p, "x"); !errors.Is(err, ErrRefused) {
		t.Errorf("every connection busy: %v, want refused", err)
	}
	p.put(c)
	if _, err := call(context.Background(), p, strings.Repeat("x", MaxPayload+1)); !errors.Is(err, ErrRefused) {
		t.Errorf("a payload over MaxPayload: %v, want refused", err)
	}
}

// TestHostileAnswersAreRefused: what is not an answer of RL.CHECK (a port
// that speaks another protocol, a length over MaxAnswer or a lying one, a
// bulk without its CRLF) is refused before its bytes are held, and the
// port is left alone for RetryAfter; an error answer is refused too, the
// connection kept.
func TestHostileAnswersAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		lost         bool // the connection ended within an answer
	}{
		{"HTTP", "HTTP/1.1 400 Bad Request\r\n\r\n", false},
		{"HTTP/2 settings", "\x00\x00\x0c\x04\x00\x00\x00\x00\x00", false},
		{"over MaxAnswer", fmt.Sprintf("$%d\r\n", MaxAnswer+1), false},
		{"length overflows", "$99999999999999999999\r\n", false},
		{"negative length", "$-1\r\n", false},
		{"no CRLF after the bulk", "$1\r\nxyz", false},
		{"a long line", "-" + strings.Repeat("e", 8<<10) + "\r\n", false},
		{"lying length", "$100\r\nshort\r\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startPort(t, func([]byte) ([]byte, bool) { return []byte(tc.answer), true })
			p := ready(t, f.lis.Addr().String(), 2)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if tc.lost {
				// The fake closes nothing: the client waits for the rest
				// until its caller gives up, and the connection is dropped.
				if _, err := call(ctx, p, "x"); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%v, want the caller's deadline", err)
				}
				return
			}
			_, err := call(ctx, p, "x")
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("%v, want refused", err)
			}
			if _, err := call(ctx, p, "x"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "ago") {
				t.Errorf("the next call: %v, want refused for RetryAfter", err)
			}
		})
	}
}

// TestErrorAnswerKeepsTheConnection: a node that does not know RL.CHECK
// answers an error; the call is refused, and the port left alone.
func TestErrorAnswerKeepsTheConnection(t *testing.T) {
	f := startPort(t, func([]byte) ([]byte, bool) { return []byte("-ERR unknown command 'RL.CHECK'\r\n"), true })
	p := ready(t, f.lis.Addr().String(), 1)
	if _, err := call(context.Background(), p, "x"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("%v, want refused with the node's error", err)
	}
	p.mu.Lock()
	idle, open := len(p.idle), p.open
	p.mu.Unlock()
	if idle != 1 || open != 1 {
		t.Errorf("%d idle of %d open, want the connection kept", idle, open)
	}
}

// TestClosedConnections: a connection the node closed while it was idle
// refuses the call (nothing read it); one that ends after the command
// was read loses it (the node may have decided it).
func TestClosedConnections(t *testing.T) {
	closeNext := make(chan bool, 4)
	f := startPort(t, func(p []byte) ([]byte, bool) {
		if <-closeNext {
			return nil, false
		}
		return bulk(p), true
	})
	p := ready(t, f.lis.Addr().String(), 1)
	closeNext <- false
	if _, err := call(context.Background(), p, "x"); err != nil {
		t.Fatal(err)
	}
	// Reused, closed before an answer: as an idle close looks.
	closeNext <- true
	if _, err := call(context.Background(), p, "x"); !errors.Is(err, ErrRefused) {
		t.Errorf("a reused connection closed: %v, want refused", err)
	}
	// A fresh connection that ends: lost.
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d connections open after a close, want 0", open)
	}
	p = ready(t, f.lis.Addr().String(), 1)
	closeNext <- true
	if _, err := call(context.Background(), p, "x"); !errors.Is(err, ErrLost) {
		t.Errorf("a fresh connection closed: %v, want lost", err)
	}
}

// TestIdleClose: a connection the node closed after its answer, the
// client holding it idle, refuses the next call, which goes with the read
// of its answer (rawio.WriteRead): the close is seen, not waited on.
func TestIdleClose(t *testing.T) {
	f := startPort(t, echo)
	f.closeIdle.Store(true)
	p := ready(t, f.lis.Addr().String(), 1)
	if _, err := call(context.Background(), p, "x"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // the close arrives before the next call
	done := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), p, "x") // no deadline: a wait would hang the test
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrRefused) {
			t.Errorf("a connection closed while idle: %v, want refused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call on a connection closed while idle did not return within 10s")
	}
}

// TestCallerThatGivesUp: a caller whose context ends returns at once, and
// its connection, whose next answer is unknown, is dropped.
func TestCallerThatGivesUp(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	f := startPort(t, func([]byte) ([]byte, bool) { <-hold; return nil, false })
	p := ready(t, f.lis.Addr().String(), 1)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := call(ctx, p, "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want canceled", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open != 0 || len(p.idle) != 0 {
		t.Errorf("%d open, %d idle after a caller gave up, want none", p.open, len(p.idle))
	}
}

// TestUnreachablePortBacksOff: a port nothing listens on is dialled in
// the background, and then left alone for RetryAfter.
func TestUnreachablePortBacksOff(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	p := New(addr, 2)
	defer p.Close()
	if _, err := call(context.Background(), p, "x"); !errors.Is(err, ErrRefused) {
		t.Fatalf("%v, want refused", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := call(context.Background(), p, "x")
		if strings.Contains(err.Error(), "ago") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after 5s, want refused for RetryAfter", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// FuzzReadAnswer: whatever a port sends, readAnswer returns an answer, an
// error line or an error, never holding more than MaxAnswer bytes, and
// never panics.
func FuzzReadAnswer(f *testing.F) {
	f.Add([]byte("$3\r\nabc\r\n"))
	f.Add([]byte("-ERR unknown command\r\n"))
	f.Add([]byte("$0\r\n\r\n$1\r\n"))
	f.Add([]byte("$1048577\r\n"))
	f.Add([]byte("+OK\r\n"))
	f.Add([]byte("$5\r\nab"))
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(in), 4<<10)
		for range 4 {
			payload, errLine, err := readAnswer(br, nil)
			if err != nil {
				return
			}
			if len(payload) > MaxAnswer || len(errLine) > maxErrorLine {
				t.Fatalf("held %d bytes, %d of an error line", len(payload), len(errLine))
			}
			if errLine == "" && !bytes.Contains(in, payload) {
				t.Fatalf("payload %q is not in the input", payload)
			}
		}
	})
}
