package snapshot

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// Version is the snapshot file format this build writes and reads. Any
// change to the layout in FORMAT.md is a new version; the counter records
// inside have their own (limiter.CounterVersion).
const Version = 1

// magic starts every snapshot file. Its first byte is not ASCII, so that
// no text file passes for a snapshot.
const magic = "\x89RLSNAP\n"

// The fixed parts of a file: the header without the node name (magic,
// version, name length, time written) and the trailer (end mark, record
// count, checksum).
const (
	headerFixed = len(magic) + 2 + 2 + 8
	trailerSize = 4 + 8 + 4
)

// castagnoli is CRC-32C's table: hardware-accelerated on amd64 and arm64.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// The ways a file is refused. Each error Decode returns wraps one of them,
// or is the reader's own I/O error.
var (
	// ErrForeign: not a snapshot (another magic), or, for Dir.Load, one
	// written under another node's name.
	ErrForeign = errors.New("not a snapshot of this node")
	// ErrUnknownVersion: a snapshot in a format version this build does
	// not know.
	ErrUnknownVersion = errors.New("unknown snapshot format version")
	// ErrTruncated: the file ends before its checksum.
	ErrTruncated = errors.New("snapshot truncated")
	// ErrCorrupt: a checksum that does not match, an impossible length or
	// count, or bytes after the checksum.
	ErrCorrupt = errors.New("snapshot corrupt")
	// ErrTooLarge: more records or bytes than the Limits allow.
	ErrTooLarge = errors.New("snapshot too large")
)

// Header is what a snapshot says about itself.
type Header struct {
	// Node is the name of the node that wrote it: 1..peerpb.MaxNodeNameLen
	// bytes, as peer messages bound a node's name.
	Node string
	// Written is when the write began: every counter in the file is at
	// least as recent as the store was then.
	Written time.Time
}

// Limits bound what a snapshot file may hold, so that reading one costs
// bounded memory (one record, at most limiter.MaxCounterBytes) and
// bounded time, whatever the file holds.
type Limits struct {
	Counters int   // records
	Bytes    int64 // the whole file
}

// LimitsFor returns the limits of the snapshots of a store that holds at
// most counters counters, logEntries sliding-log entries and reservations
// reservations (limiter.Store.Bounds), doubled: the last snapshot of a
// shutdown holds the counters the node handed off as well as those it
// still holds, and a counter may be in both (see Dir.StartFinal). Each
// counter takes at most a 4-byte length and limiter.MaxFixedCounterBytes,
// plus algorithms.LogEntryBytes a log entry and limiter.ReservationBytes a
// reservation.
func LimitsFor(counters, logEntries, reservations int) Limits {
	one := int64(counters)*(4+limiter.MaxFixedCounterBytes) + int64(logEntries)*algorithms.LogEntryBytes +
		int64(reservations)*limiter.ReservationBytes
	return Limits{Counters: 2 * counters, Bytes: int64(headerFixed+peerpb.MaxNodeNameLen+trailerSize) + 2*one}
}

// Encoder writes one snapshot file: NewEncoder writes the header, Add
// each record, Close the trailer. It refuses to write what Decode with
// the same Limits would refuse. It is not safe for concurrent use.
type Encoder struct {
	w     *bufio.Writer // into dst and crc
	dst   io.Writer
	crc   hash.Hash32
	lim   Limits
	count int
	bytes int64 // written so far, the trailer's included once Close has run
}

// NewEncoder writes h to w and returns an Encoder for the records after
// it. w should be buffered by the caller only if it is slow to write
// small pieces to: the Encoder buffers what it writes.
func NewEncoder(w io.Writer, h Header, lim Limits) (*Encoder, error) {
	if h.Node == "" || len(h.Node) > peerpb.MaxNodeNameLen {
		return nil, fmt.Errorf("snapshot header: node name of %d bytes, want 1..%d", len(h.Node), peerpb.MaxNodeNameLen)
	}
	e := &Encoder{dst: w, crc: crc32.New(castagnoli), lim: lim}
	e.w = bufio.NewWriterSize(io.MultiWriter(w, e.crc), 256<<10)
	b := make([]byte, 0, headerFixed+len(h.Node))
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.Node)))
	b = append(b, h.Node...)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Written.UnixNano()))
	return e, e.write(b)
}

func (e *Encoder) write(b []byte) error {
	e.bytes += int64(len(b))
	_, err := e.w.Write(b)
	return err
}

// Fits reports whether a record of n bytes can be added.
func (e *Encoder) Fits(n int) bool {
	return e.count < e.lim.Counters && e.bytes+4+int64(n)+trailerSize <= e.lim.Bytes
}

// Count returns the records added.
func (e *Encoder) Count() int { return e.count }

// Bytes returns the bytes written: the whole file once Close has run.
func (e *Encoder) Bytes() int64 { return e.bytes }

// Add writes one record: a limiter.Counter's binary form, 1 to
// limiter.MaxCounterBytes bytes. Beyond the Limits it writes nothing and
// returns an error wrapping ErrTooLarge.
func (e *Encoder) Add(record []byte) error {
	switch {
	case len(record) == 0 || len(record) > limiter.MaxCounterBytes:
		return fmt.Errorf("snapshot record of %d bytes, want 1..%d", len(record), limiter.MaxCounterBytes)
	case !e.Fits(len(record)):
		return fmt.Errorf("snapshot of more than %d records or %d bytes: %w", e.lim.Counters, e.lim.Bytes, ErrTooLarge)
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(record)))
	if err := e.write(n[:]); err != nil {
		return err
	}
	e.count++
	return e.write(record)
}

// Close writes the trailer: the end mark, the record count and the
// checksum of every byte before it. It does not close the writer.
func (e *Encoder) Close() error {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[4:], uint64(e.count)) // b[:4] is the end mark, a length of 0
	if err := e.write(b[:]); err != nil {
		return err
	}
	if err := e.w.Flush(); err != nil {
		return err
	}
	sum := binary.LittleEndian.AppendUint32(nil, e.crc.Sum32())
	e.bytes += int64(len(sum))
	_, err := e.dst.Write(sum)
	return err
}

// decoder reads a snapshot, keeping the checksum of what it has read and
// a count of its bytes.
type decoder struct {
	r     *bufio.Reader
	crc   hash.Hash32
	lim   Limits
	bytes int64
	buf   []byte
}

// read returns the next n bytes (valid until the next read), counting
// them in the checksum.
func (d *decoder) read(n int, what string) ([]byte, error) {
	if d.bytes += int64(n); d.bytes > d.lim.Bytes {
		return nil, fmt.Errorf("%s: past %d bytes: %w", what, d.lim.Bytes, ErrTooLarge)
	}
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%s: the file ends at byte %d or before: %w", what, d.bytes, ErrTruncated)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	d.crc.Write(b)
	return b, nil
}

// Decode reads a snapshot from r, strictly: the magic (else ErrForeign),
// the version (else ErrUnknownVersion), the header, then each record,
// which it passes to each (if not nil) as it reads it, then the trailer,
// whose record count and checksum must match what it read, and then
// nothing more (else ErrCorrupt). A file that ends early is ErrTruncated;
// one larger than lim allows is ErrTooLarge, found before anything is
// allocated for it: a record takes at most limiter.MaxCounterBytes. The
// record passed to each is valid only during the call; an error each
// returns stops the reading and is returned. The records are not checked
// here, nor can the checksum vouch for them before the end: a caller
// that must not act on a corrupt file decodes it twice, first with each
// nil.
func Decode(r io.Reader, lim Limits, each func(record []byte) error) (Header, error) {
	d := &decoder{r: bufio.NewReaderSize(io.LimitReader(r, lim.Bytes+1), 256<<10), crc: crc32.New(castagnoli), lim: lim}
	var h Header
	// As much of the magic as there is decides: a file cut short in it is
	// ours, truncated; one that differs is not ours.
	var m [len(magic)]byte
	got, err := io.ReadFull(d.r, m[:])
	d.crc.Write(m[:got])
	d.bytes = int64(got)
	switch {
	case !bytes.HasPrefix([]byte(magic), m[:got]):
		return h, fmt.Errorf("magic %q, want %q: %w", m[:got], magic, ErrForeign)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return h, fmt.Errorf("magic: the file ends at byte %d: %w", got, ErrTruncated)
	case err != nil:
		return h, fmt.Errorf("magic: %w", err)
	}
	b, err := d.read(4, "header")
	if err != nil {
		return h, err
	}
	if v := binary.LittleEndian.Uint16(b); v != Version {
		return h, fmt.Errorf("format version %d, this build reads %d: %w", v, Version, ErrUnknownVersion)
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if n == 0 || n > peerpb.MaxNodeNameLen {
		return h, fmt.Errorf("node name of %d bytes, want 1..%d: %w", n, peerpb.MaxNodeNameLen, ErrCorrupt)
	}
	if b, err = d.read(n+8, "header"); err != nil {
		return h, err
	}
	h.Node = string(b[:n])
	h.Written = time.Unix(0, int64(binary.LittleEndian.Uint64(b[n:])))
	count := 0
	for {
		if b, err = d.read(4, "record length"); err != nil {
			return h, err
		}
		size := int(binary.LittleEndian.Uint32(b))
		if size == 0 {
			break
		}
		if count++; count > lim.Counters {
			return h, fmt.Errorf("more than %d records: %w", lim.Counters, ErrTooLarge)
		}
		if size > limiter.MaxCounterBytes {
			return h, fmt.Errorf("record %d: %d bytes, more than a counter takes, %d: %w", count, size, limiter.MaxCounterBytes, ErrCorrupt)
		}
		if b, err = d.read(size, fmt.Sprint("record ", count)); err != nil {
			return h, err
		}
		if each != nil {
			if err := each(b); err != nil {
				return h, err
			}
		}
	}
	if b, err = d.read(8, "record count"); err != nil {
		return h, err
	}
	if c := binary.LittleEndian.Uint64(b); c != uint64(count) {
		return h, fmt.Errorf("the trailer counts %d records, the file holds %d: %w", c, count, ErrCorrupt)
	}
	want := d.crc.Sum32()
	if b, err = d.read(4, "checksum"); err != nil {
		return h, err
	}
	if got := binary.LittleEndian.Uint32(b); got != want {
		return h, fmt.Errorf("checksum %08x, the bytes read sum to %08x: %w", got, want, ErrCorrupt)
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		if err == nil {
			err = fmt.Errorf("bytes after the checksum: %w", ErrCorrupt)
		}
		return h, err
	}
	return h, nil
}
