package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection, the server's
// through Wrap.
func tcpPair(t testing.TB) (server, client net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err = net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { client.Close() })
	nc, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	server = Wrap(nc)
	if _, ok := server.(rawConn); !ok {
		t.Fatalf("Wrap(%T) = %T, want a rawConn", nc, server)
	}
	return server, client
}

// TestRawConn: what rawConn reads and writes arrives whole, through
// writes that would block (EAGAIN) and reads that wait; the end of the
// input is io.EOF, a deadline and a closed connection are net.Conn's
// errors.
func TestRawConn(t *testing.T) {
	server, client := tcpPair(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB: far more than the socket buffers
	done := make(chan error, 1)
	go func() {
		_, err := server.Write(big)
		done <- err
	}()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("client read %v, equal %v", err, bytes.Equal(got, big))
	}
	if err := <-done; err != nil {
		t.Fatalf("Write: %v", err)
	}

	go func() {
		time.Sleep(10 * time.Millisecond) // the read waits for it
		client.Write(big)
		client.Close()
	}()
	if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("server read %v, equal %v", err, bytes.Equal(got, big))
	}
	if n, err := server.Read(got); n != 0 || err != io.EOF {
		t.Fatalf("Read at the end = %d, %v; want 0, io.EOF", n, err)
	}

	server, peer := tcpPair(t) // client may still be closing, on the goroutine above
	one, buf := []byte("x"), make([]byte, 1)
	exchange := func() {
		if _, err := server.Write(one); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Read(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(one); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if n := testing.AllocsPerRun(100, exchange); n != 0 {
		t.Errorf("a Read and a Write allocate %v times, want 0", n)
	}

	server.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := server.Read(got); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	server.Close()
	if _, err := server.Read(got); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := server.Write(got); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// TestRawConnReset: a peer's reset (a close with SO_LINGER 0) is an error
// of the next Read and Write, with no bytes counted: read(2) and write(2)
// return -1 then, which was once handed to bufio as a count and panicked
// the node ("bufio: reader returned negative count from Read").
func TestRawConnReset(t *testing.T) {
	server, client := tcpPair(t)
	if _, err := client.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := server.Read(buf); err != nil || n == 0 {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if _, err := server.Write([]byte("+PONG\r\n")); err != nil {
		t.Fatal(err)
	}
	client.(*net.TCPConn).SetLinger(0)
	client.Close() // a reset, with the answer unread
	for i := 0; i < 3; i++ {
		n, err := server.Read(buf)
		if n != 0 || err == nil {
			t.Fatalf("Read after a reset = %d, %v; want 0 and an error", n, err)
		}
	}
	for i := 0; i < 3; i++ {
		n, err := server.Write(buf)
		if n < 0 || n > len(buf) || (err == nil && i > 0) {
			t.Fatalf("Write after a reset = %d, %v", n, err)
		}
	}
}

// echo answers each byte that arrives at peer with one byte, until peer
// is closed.
func echo(peer net.Conn) {
	buf := make([]byte, 64)
	for {
		n, err := peer.Read(buf)
		if err != nil {
			return
		}
		if _, err := peer.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestWriteRead: WriteRead's command arrives and its answer is read, with
// no allocation; a write that fails is werr, with nothing read, and the
// end of the input is rerr io.EOF.
func TestWriteRead(t *testing.T) {
	client, peer := tcpPair(t)
	go echo(peer)
	one, buf := []byte("x"), make([]byte, 8)
	exchange := func() {
		if n, werr, rerr := WriteRead(client, one, buf); n != 1 || werr != nil || rerr != nil || buf[0] != 'x' {
			t.Fatalf("WriteRead = %d, %v, %v; want 1 byte back", n, werr, rerr)
		}
	}
	exchange()
	if n := testing.AllocsPerRun(100, exchange); n != 0 {
		t.Errorf("WriteRead allocates %v times, want 0", n)
	}
	// Interleaved with plain reads and writes, on the same connection.
	if _, err := client.Write(one); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Read(buf); err != nil {
		t.Fatal(err)
	}
	exchange()

	peer.Close()
	for i := 0; ; i++ { // the echo's close: EOF, once the peer's FIN is in
		n, werr, rerr := WriteRead(client, one, buf)
		if n == 0 && (werr != nil || rerr == io.EOF) {
			break
		}
		if i > 100 {
			t.Fatalf("WriteRead to a closed peer = %d, %v, %v", n, werr, rerr)
		}
	}
	client.Close()
	if n, werr, rerr := WriteRead(client, one, buf); n != 0 || !errors.Is(werr, net.ErrClosed) || rerr != nil {
		t.Fatalf("WriteRead after Close = %d, %v, %v; want 0, net.ErrClosed as the write's error", n, werr, rerr)
	}
}

// BenchmarkWriteRead measures one byte's round trip to an echo on
// loopback: Write then Read, against WriteRead, which saves the read(2)
// that would find nothing yet.
func BenchmarkWriteRead(b *testing.B) {
	for _, name := range []string{"write-then-read", "writeread"} {
		b.Run(name, func(b *testing.B) {
			client, peer := tcpPair(b)
			go echo(peer)
			one, buf := []byte("x"), make([]byte, 8)
			b.ReportAllocs()
			for b.Loop() {
				if name == "writeread" {
					if _, werr, rerr := WriteRead(client, one, buf); werr != nil || rerr != nil {
						b.Fatal(werr, rerr)
					}
					continue
				}
				if _, err := client.Write(one); err != nil {
					b.Fatal(err)
				}
				if _, err := client.Read(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
