package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/service"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// clock is a test's clock, shared by the server and the service.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) set(d time.Duration)     { c.ns.Store(t0.Add(d).UnixNano()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// testServer is a Server on a loopback port, deciding with a single-node
// service on clk, shut down when the test ends.
type testServer struct {
	*Server
	addr string
	svc  *service.Service
}

func startServer(t testing.TB, clk *clock, conf Config) *testServer {
	t.Helper()
	svc := service.New(service.Config{Now: clk.now})
	conf.Checker, conf.Now = svc, clk.now
	s := New(conf)
	lis := listen(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return &testServer{Server: s, addr: lis.Addr().String(), svc: svc}
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func goRedis(t *testing.T, addr string, protocol int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: protocol, MaxRetries: -1, PoolSize: 2})
	t.Cleanup(func() { c.Close() })
	return c
}

// throttleCmd runs CL.THROTTLE through go-redis and returns its five
// integers.
func throttleCmd(t *testing.T, c *redis.Client, args ...any) []int64 {
	t.Helper()
	v, err := c.Do(context.Background(), append([]any{"CL.THROTTLE"}, args...)...).Int64Slice()
	if err != nil {
		t.Fatalf("CL.THROTTLE %v: %v", args, err)
	}
	return v
}

// TestReadmeExample is redis-cell's README example: a fresh key, one
// token of 30 per minute with a burst of 15.
func TestReadmeExample(t *testing.T) {
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			s := startServer(t, newClock(), Config{})
			got := throttleCmd(t, goRedis(t, s.addr, proto), "user123", 15, 30, 60)
			if want := []int64{0, 16, 15, -1, 2}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("CL.THROTTLE user123 15 30 60 = %v, want %v", got, want)
			}
		})
	}
}

// TestRedisCellTimeline plays redis-cell's own test of its limiter (5
// tokens, 1 a second) through the port, its durations rounded to seconds
// as redis-cell's command rounds them.
func TestRedisCellTimeline(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, Config{})
	c := goRedis(t, s.addr, 3)
	ms := time.Millisecond
	cases := []struct {
		at                 time.Duration
		quantity           int64
		limited, remaining int64
		retry, reset       int64
	}{
		{0, 6, 1, 5, -1, 0}, // never more than the maximum
		{0, 1, 0, 4, -1, 1},
		{0, 1, 0, 3, -1, 2},
		{0, 1, 0, 2, -1, 3},
		{0, 1, 0, 1, -1, 4},
		{0, 1, 0, 0, -1, 5},
		{0, 1, 1, 0, 1, 5},
		{3000 * ms, 1, 0, 2, -1, 3},
		{3100 * ms, 1, 0, 1, -1, 4}, // 3.9 s
		{4000 * ms, 1, 0, 1, -1, 4},
		{8000 * ms, 1, 0, 4, -1, 1},
		{9500 * ms, 1, 0, 4, -1, 1},
		{9500 * ms, 0, 0, 4, -1, 1}, // a quantity of 0 looks
		{9500 * ms, 2, 0, 2, -1, 3},
		{9500 * ms, 5, 1, 2, 3, 3},
	}
	for i, tc := range cases {
		clk.set(tc.at)
		got := throttleCmd(t, c, "foo", 4, 1, 1, tc.quantity)
		want := []int64{tc.limited, 5, tc.remaining, tc.retry, tc.reset}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("case %d (at %v, quantity %d): got %v, want %v", i, tc.at, tc.quantity, got, want)
		}
	}
}

// TestSameCounterBothWays checks one counter alternately through the
// port and as the native check docs/resp.md maps it to.
func TestSameCounterBothWays(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	c := goRedis(t, s.addr, 2)
	native := &pb.CheckItem{Name: Name, Key: "k", Algorithm: pb.Algorithm_GCRA, Limit: 10, DurationMs: 60_000, Burst: 5}
	for i := range 6 {
		var remaining int64
		var limited bool
		if i%2 == 0 {
			got := throttleCmd(t, c, "k", 4, 10, 60)
			remaining, limited = got[2], got[0] == 1
		} else {
			res, err := s.svc.Check(context.Background(), &pb.CheckRequest{Requests: []*pb.CheckItem{native}})
			if err != nil {
				t.Fatal(err)
			}
			r := res.GetResponses()[0]
			remaining, limited = r.GetRemaining(), r.GetStatus() == pb.Status_OVER_LIMIT
		}
		wantRemaining, wantLimited := int64(4-i), i == 5
		if i == 5 {
			wantRemaining = 0
		}
		if remaining != wantRemaining || limited != wantLimited {
			t.Errorf("check %d: remaining %d limited %v, want %d %v", i, remaining, limited, wantRemaining, wantLimited)
		}
	}
}

// TestPipelineInOrder sends CL.THROTTLE and other commands in one
// pipeline: every answer comes back in the order of its command.
func TestPipelineInOrder(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	c := goRedis(t, s.addr, 3)
	ctx := context.Background()
	pipe := c.Pipeline()
	var cmds []redis.Cmder
	for i := range 40 {
		if i%7 == 3 {
			cmds = append(cmds, pipe.Ping(ctx))
			continue
		}
		cmds = append(cmds, pipe.Do(ctx, "CL.THROTTLE", "p", 99, 100, 1))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	remaining := int64(100)
	for i, cmd := range cmds {
		if p, ok := cmd.(*redis.StatusCmd); ok {
			if p.Val() != "PONG" {
				t.Errorf("command %d: %q, want PONG", i, p.Val())
			}
			continue
		}
		v, err := cmd.(*redis.Cmd).Int64Slice()
		if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		remaining--
		if v[2] != remaining {
			t.Errorf("command %d: remaining %d, want %d (answers out of order?)", i, v[2], remaining)
		}
	}
}

// TestLongPipelineIsBatched sends more CL.THROTTLEs in one write than a
// check request may carry: they are split, and each is decided once.
func TestLongPipelineIsBatched(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	conn := dial(t, s.addr)
	const n = 2500
	go func() {
		var b strings.Builder
		for range n {
			b.WriteString("*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nb\r\n$4\r\n3000\r\n$1\r\n1\r\n$4\r\n3600\r\n")
		}
		conn.Write([]byte(b.String()))
	}()
	br := bufio.NewReader(conn)
	for i := range n {
		a := readArray(t, br)
		if want := fmt.Sprint([]string{"0", "3001", fmt.Sprint(3000 - i), "-1", fmt.Sprint((i + 1) * 3600)}); fmt.Sprint(a) != want {
			t.Fatalf("answer %d: %v, want %v", i, a, want)
		}
	}
}

func dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// readArray reads an array of integers, as their decimal strings.
func readArray(t *testing.T, br *bufio.Reader) []string {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*") {
		t.Fatalf("array header: %q, %v", line, err)
	}
	var n int
	fmt.Sscanf(line, "*%d", &n)
	out := make([]string, n)
	for i := range out {
		l, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(l, ":") {
			t.Fatalf("integer: %q, %v", l, err)
		}
		out[i] = strings.TrimSuffix(l[1:], "\r\n")
	}
	return out
}

// TestBadInput sends what a hostile or broken client might: each gets
// an error naming the problem; input that breaks the protocol or a bound
// also closes the connection, having held no more than the bounds.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name, in, want string
		closes         bool
	}{
		{"wrong arity", "*3\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$1\r\n1\r\n", "-ERR wrong number of arguments for 'CL.THROTTLE' command", false},
		{"seven arguments", "CL.THROTTLE k 1 1 1 1 1\r\n", "-ERR wrong number of arguments", false},
		{"non-integer burst", "CL.THROTTLE k x 1 1\r\n", `-ERR max_burst is not an integer: "x"`, false},
		{"non-integer count", "CL.THROTTLE k 1 1.5 1\r\n", `-ERR count_per_period is not an integer: "1.5"`, false},
		{"negative burst", "CL.THROTTLE k -1 1 1\r\n", "-ERR max_burst must be between 0 and 999999999, got -1", false},
		{"negative quantity", "CL.THROTTLE k 1 1 1 -3\r\n", "-ERR quantity must be between 0 and 1000000000, got -3", false},
		{"zero period", "CL.THROTTLE k 1 1 0\r\n", "-ERR period must be between 1 and 31536000, got 0", false},
		{"zero count", "CL.THROTTLE k 1 0 1\r\n", "-ERR count_per_period must be between 1 and", false},
		{"huge count", "CL.THROTTLE k 1 99999999999999999999 1\r\n", "-ERR count_per_period is not an integer", false},
		{"empty key", "*5\r\n$11\r\nCL.THROTTLE\r\n$0\r\n\r\n$1\r\n1\r\n$1\r\n1\r\n$1\r\n1\r\n", "-ERR key must not be empty", false},
		{"unknown command", "FLUSHALL\r\n", "-ERR unknown command 'FLUSHALL'", false},
		{"unknown command with CRLF", "*1\r\n$5\r\nA\r\nBC\r\n", "-ERR unknown command 'A  BC'", false},
		{"MULTI", "MULTI\r\n", "-ERR MULTI is not supported", false},
		{"SUBSCRIBE", "*2\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n", "-ERR SUBSCRIBE is not supported", false},
		{"SELECT 1", "SELECT 1\r\n", "-ERR DB index is out of range", false},
		{"HELLO 4", "HELLO 4\r\n", "-NOPROTO unsupported protocol version", false},
		{"HELLO AUTH", "HELLO 3 AUTH u p\r\n", "-ERR AUTH is not supported", false},
		{"512 MB bulk", "*2\r\n$4\r\nPING\r\n$536870912\r\n", "-ERR Protocol error: bulk length 536870912 is more than 4096", true},
		{"huge array", "*1000000\r\n", "-ERR Protocol error: array length 1000000 is more than 32", true},
		{"endless length", "*2\r\n$4\r\nPING\r\n$99999999999999999999999\r\n", "-ERR Protocol error: bulk length 99999999999999999999 is more than 4096", true},
		{"negative bulk", "*1\r\n$-1\r\n", `-ERR Protocol error: invalid bulk length "-1"`, true},
		{"not a bulk", "*1\r\n:1\r\n", `-ERR Protocol error: expected '$', got ":"`, true},
		{"megabytes inline", strings.Repeat("A", 3<<20) + "\r\n", "-ERR Protocol error: inline command longer than 16384 bytes", true},
		{"command too long", "*9\r\n" + strings.Repeat("$4000\r\n"+strings.Repeat("x", 4000)+"\r\n", 9), "-ERR Protocol error: command longer than 16384 bytes", true},
		{"bulk without CRLF", "*1\r\n$4\r\nPINGxx", "-ERR Protocol error: bulk string does not end in CRLF", true},
		{"header without CR", "*1\n", "-ERR Protocol error: array header does not end in CRLF", true},
	}
	s := startServer(t, newClock(), Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, s.addr)
			go conn.Write([]byte(tc.in)) // may fail once the server closes: it need not read it all
			br := bufio.NewReader(conn)
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, tc.want) {
				t.Fatalf("answer %q (%v), want it to begin %q", line, err, tc.want)
			}
			if !tc.closes {
				// The connection still serves.
				conn.Write([]byte("PING\r\n"))
				if line, err := br.ReadString('\n'); line != "+PONG\r\n" {
					t.Fatalf("after the error: %q, %v; want +PONG", line, err)
				}
				return
			}
			if _, err := io.Copy(io.Discard, br); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
				t.Fatalf("after a protocol error: %v, want the connection closed", err)
			}
		})
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

// TestQuit answers QUIT and closes the connection, after the answers of
// the commands before it.
func TestQuit(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	conn := dial(t, s.addr)
	conn.Write([]byte("CL.THROTTLE q 0 1 1\r\nQUIT\r\nPING\r\n"))
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	if want := "*5\r\n:0\r\n:1\r\n:0\r\n:-1\r\n:1\r\n+OK\r\n"; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestClientsConnect runs what go-redis sends as it connects in both
// protocols, and the commands of its tools.
func TestClientsConnect(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		c := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: proto, DB: 0, ClientName: "app"})
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("RESP%d: PING: %v", proto, err)
		}
		if n, err := c.Do(ctx, "COMMAND", "COUNT").Int64(); err != nil || n != 1 {
			t.Errorf("COMMAND COUNT = %d, %v", n, err)
		}
		if err := c.Do(ctx, "COMMAND", "DOCS").Err(); err != nil {
			t.Errorf("COMMAND DOCS: %v", err)
		}
		if v, err := c.Echo(ctx, "x").Result(); err == nil {
			t.Errorf("ECHO answered %q, want an unknown command", v)
		}
		c.Close()
	}
}

// TestIdleAndSlowConnectionsCut: a connection that sends nothing, and
// one that trickles a command, are closed by the server.
func TestIdleAndSlowConnectionsCut(t *testing.T) {
	s := startServer(t, newClock(), Config{IdleTimeout: 100 * time.Millisecond, HandshakeTimeout: 100 * time.Millisecond})
	idle := dial(t, s.addr)
	slow := dial(t, s.addr)
	slow.Write([]byte("*2\r\n$4\r\nPING\r\n")) // and the rest never
	for name, c := range map[string]net.Conn{"idle": idle, "slow": slow} {
		if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
			t.Errorf("%s: read %d bytes, %v; want the server to close it", name, n, err)
		}
	}
}

// TestTricklingCommandCut: a command that arrives a byte at a time is
// cut HandshakeTimeout after its first byte, however often bytes come.
func TestTricklingCommandCut(t *testing.T) {
	s := startServer(t, newClock(), Config{IdleTimeout: time.Minute, HandshakeTimeout: 100 * time.Millisecond})
	conn := dial(t, s.addr)
	var wg sync.WaitGroup
	wg.Go(func() {
		conn.Write([]byte("*2\r\n$4\r\nPING\r\n$2000\r\n"))
		for range 2000 { // 20 s of it at most
			time.Sleep(10 * time.Millisecond)
			if _, err := conn.Write([]byte("p")); err != nil {
				return
			}
		}
	})
	if n, err := io.Copy(io.Discard, conn); (err != nil && !isReset(err)) || n != 0 {
		t.Errorf("read %d bytes, %v; want the server to close it", n, err)
	}
	conn.Close()
	wg.Wait()
}

// TestSlowReaderCut: a client that sends commands and never reads the
// answers is closed once a write has waited WriteTimeout.
func TestSlowReaderCut(t *testing.T) {
	s := startServer(t, newClock(), Config{WriteTimeout: 100 * time.Millisecond})
	// A small receive buffer (which also turns the kernel's tuning of it
	// off) keeps the window the server may fill small, so that its writes
	// block soon even on a slow machine.
	conn := dial(t, s.addr)
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	ping := "*2\r\n$4\r\nPING\r\n$4000\r\n" + strings.Repeat("p", 4000) + "\r\n"
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 10_000 { // 40 MB of answers, far more than socket buffers hold
			if _, err := conn.Write([]byte(ping)); err != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for s.open() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the connection that reads nothing is still open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn.Close()
	wg.Wait()
}

// TestDeadlineCtx: the context of a batch is done at its deadline,
// whether or not Done was called before it, and once stopped.
func TestDeadlineCtx(t *testing.T) {
	newCtx := func() *deadlineCtx {
		return &deadlineCtx{Context: context.Background(), deadline: time.Now().Add(time.Second)}
	}
	t.Run("Err alone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx := newCtx()
			if err := ctx.Err(); err != nil {
				t.Fatalf("Err before the deadline: %v", err)
			}
			time.Sleep(time.Second)
			if err := ctx.Err(); err != context.DeadlineExceeded {
				t.Fatalf("Err at the deadline: %v", err)
			}
			<-ctx.Done()
			ctx.stop()
			if err := ctx.Err(); err != context.DeadlineExceeded {
				t.Fatalf("Err stopped after the deadline: %v", err)
			}
		})
	})
	t.Run("Done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx := newCtx()
			child, cancel := context.WithCancel(ctx) // waits on ctx.Done
			defer cancel()
			start := time.Now()
			<-child.Done()
			if waited := time.Since(start); waited != time.Second || ctx.Err() != context.DeadlineExceeded {
				t.Fatalf("done after %v with %v, want 1s and DeadlineExceeded", waited, ctx.Err())
			}
		})
	})
	t.Run("stop", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			for _, wait := range []bool{false, true} {
				ctx := newCtx()
				if wait {
					ctx.Done()
				}
				ctx.stop()
				<-ctx.Done()
				if err := ctx.Err(); err != context.Canceled {
					t.Fatalf("Err once stopped (Done called before: %v): %v", wait, err)
				}
			}
		})
	})
}

// open counts the connections being served.
func (s *Server) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// TestShutdownAnswersWhatWasRead: Shutdown closes idle connections, and
// the server refuses new ones.
func TestShutdownClosesConnections(t *testing.T) {
	svc := service.New(service.Config{})
	s := New(Config{Checker: svc})
	lis := listen(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	conn := dial(t, lis.Addr().String())
	conn.Write([]byte("PING\r\n"))
	br := bufio.NewReader(conn)
	if l, _ := br.ReadString('\n'); l != "+PONG\r\n" {
		t.Fatalf("PING: %q", l)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if n, err := io.Copy(io.Discard, br); err != nil || n != 0 {
		t.Fatalf("after Shutdown: %d bytes, %v; want the connection closed", n, err)
	}
}

// TestResetConnectionsLeaveTheServerServing: clients that reset their
// connection (SO_LINGER 0) before a command, after one with its answer
// unread, and in the middle of a command or a pipeline, end only their
// own connection: the next client is served.
func TestResetConnectionsLeaveTheServerServing(t *testing.T) {
	s := startServer(t, newClock(), Config{})
	for _, sent := range []string{
		"",
		"PING\r\n",
		"*1\r\n$4\r\nPING\r\n",
		"*5\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk",
		strings.Repeat("CL.THROTTLE r 5 10 60\r\n", 500),
	} {
		for range 20 {
			conn := dial(t, s.addr)
			conn.Write([]byte(sent))
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
		c := dial(t, s.addr)
		c.Write([]byte("PING\r\n"))
		got := make([]byte, 7)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "+PONG\r\n" {
			t.Fatalf("after resets with %.20q sent: PING = %q, %v", sent, got, err)
		}
		c.Close()
	}
}
