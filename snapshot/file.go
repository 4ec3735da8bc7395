package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// writing is a snapshot being written to a temporary file in the
// directory.
type writing struct {
	f     *os.File
	enc   *Encoder
	start time.Time // when it began: the time its counters are taken at
}

// create opens a temporary file and writes the header into it.
func (d *Dir) create() (*writing, error) {
	f, err := os.CreateTemp(d.dir, tempPattern)
	if err != nil {
		return nil, err
	}
	w := &writing{f: f, start: d.now()}
	if w.enc, err = NewEncoder(f, Header{Node: d.node, Written: w.start}, d.limits); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return w, nil
}

// addStore adds the counters of store still charged when w began, until
// ctx ends. The store copies one shard at a time under its lock and
// yields with no lock held, so checks wait for no file I/O.
func (w *writing) addStore(ctx context.Context, store Store) error {
	var buf []byte
	n := 0
	for c := range store.Charged(w.start) {
		if n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		n++
		record, err := c.AppendBinary(buf[:0])
		if err != nil {
			continue // not from a store: its counters were made by valid checks, so they encode
		}
		buf = record
		if err := w.enc.Add(record); err != nil {
			return err
		}
	}
	return nil
}

// commit ends w. If err is nil, it writes the trailer, syncs the file to
// disk, renames it over the snapshot and syncs the directory, so that
// after a crash the snapshot is the old file or the new one, whole. If
// anything fails, it removes the temporary file, and the old snapshot
// stays. Either way it logs and counts the write.
func (d *Dir) commit(w *writing, err error) error {
	if w != nil {
		if err == nil {
			err = w.enc.Close()
		}
		if err == nil {
			err = w.f.Sync()
		}
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(w.f.Name(), d.path)
		}
		if err == nil {
			err = syncDir(d.dir)
		}
		if err != nil {
			os.Remove(w.f.Name()) // gone already if the rename was done
		}
	}
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		d.metrics.writes.WithLabelValues("canceled").Inc()
		d.log.Info("snapshot: write abandoned; the last one stays", "err", err)
		return err
	case err != nil:
		d.metrics.writes.WithLabelValues("failed").Inc()
		d.log.Error("snapshot: write failed; the last one stays", "path", d.path, "err", err)
		return fmt.Errorf("snapshot: %w", err)
	}
	took := d.now().Sub(w.start)
	d.metrics.writes.WithLabelValues("ok").Inc()
	d.metrics.duration.WithLabelValues("write").Observe(took.Seconds())
	d.metrics.bytes.Set(float64(w.enc.Bytes()))
	d.metrics.written.Set(float64(w.enc.Count()))
	d.metrics.lastWritten.Set(float64(w.start.UnixNano()) / 1e9)
	d.log.Debug("snapshot written", "path", d.path, "counters", w.enc.Count(), "bytes", w.enc.Bytes(), "took", took)
	return nil
}

// syncDir syncs a directory, so that a rename in it survives a crash.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
