package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer after start.
const startTimeout = 15 * time.Second

// proc is a server process this program started. Its output is kept, the
// last outputTail bytes of it, to say why it did not come up.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *tail
	done chan struct{} // closed when the process has exited
}

// start starts bin with args. The process is killed if this program dies
// without stopping it (on Linux), so that not even a SIGKILL leaves one
// behind.
func start(name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &tail{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process to exit (SIGTERM), kills it after grace, and
// returns once it has exited.
func (p *proc) stop(grace time.Duration) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// waitReady calls ready every 50ms until it reports nil, the process
// exits, ctx ends, or startTimeout passes.
func (p *proc) waitReady(ctx context.Context, ready func(context.Context) error) error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up: %s", p.name, p.out)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready within %v: %v; output: %s", p.name, startTimeout, err, p.out)
		}
	}
}

// node is an rlnode this program started, on loopback.
type node struct {
	*proc
	HTTP, GRPC, RESP string // addresses
}

// startNode starts one rlnode on free loopback ports and waits until it
// is ready.
func startNode(ctx context.Context, bin string) (*node, error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	n := &node{HTTP: loopback(ports[0]), GRPC: loopback(ports[1]), RESP: loopback(ports[4])}
	n.proc, err = start("rlnode", bin, "--node-name", "plots",
		"--http-addr", n.HTTP, "--grpc-addr", n.GRPC, "--resp-addr", n.RESP, "--peer-addr", loopback(ports[2]),
		"--gossip-addr", loopback(ports[3]), "--advertise-addr", "127.0.0.1",
		"--log-level", "warn", "--shutdown-timeout", "2s")
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: time.Second}
	err = n.waitReady(ctx, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTP+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		n.stop(time.Second)
		return nil, err
	}
	return n, nil
}

// startRedis starts a redis-server on a free loopback port, with
// persistence off, and waits until it answers PING.
func startRedis(ctx context.Context, bin string) (*proc, string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, "", err
	}
	addr := loopback(ports[0])
	p, err := start("redis-server", bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--save", "", "--appendonly", "no")
	if err != nil {
		return nil, "", err
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := p.waitReady(ctx, func(ctx context.Context) error { return rdb.Ping(ctx).Err() }); err != nil {
		p.stop(time.Second)
		return nil, "", err
	}
	return p, addr, nil
}

// freePorts returns n distinct loopback ports that were free for TCP and
// UDP (memberlist binds both on its port) a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100 {
			return nil, fmt.Errorf("found only %d free loopback ports in 100 tries", len(ports))
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen on loopback: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", loopback(port))
		if err != nil {
			continue // UDP port taken
		}
		held = append(held, u)
		ports = append(ports, port)
	}
	return ports, nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// outputTail is how much of a process's output a tail keeps.
const outputTail = 8 << 10

// tail keeps the last outputTail bytes written to it; safe for concurrent
// use, since the process writes while this program may read.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - outputTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == 0 {
		return "(no output)"
	}
	return string(t.buf)
}

// cpu is the CPU the node has used so far, user and system, as its
// /metrics states it (process_cpu_seconds_total, in 10 ms ticks on
// Linux): the figure rlnode bench reads for its own runs.
func (n *node) cpu(ctx context.Context) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.HTTP+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("rlnode /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, fmt.Errorf("rlnode /metrics: %w", err)
	}
	return parseProcessCPU(string(body))
}

// parseProcessCPU reads process_cpu_seconds_total from the text of a
// Prometheus scrape.
func parseProcessCPU(text string) (time.Duration, error) {
	for line := range strings.Lines(text) {
		value, ok := strings.CutPrefix(strings.TrimSpace(line), "process_cpu_seconds_total ")
		if !ok {
			continue
		}
		s, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil || !(s >= 0) || math.IsInf(s, 1) { // NaN fails s >= 0
			return 0, fmt.Errorf("rlnode /metrics: process_cpu_seconds_total %q, want seconds", value)
		}
		return time.Duration(s * float64(time.Second)), nil
	}
	return 0, errors.New("rlnode /metrics: no process_cpu_seconds_total")
}
