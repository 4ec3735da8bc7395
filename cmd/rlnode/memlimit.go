package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// The cgroup files that hold a container's memory limit: v2, then v1.
var cgroupMemoryFiles = [...]string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimit chooses the Go runtime's soft memory limit, so that the
// garbage collector works harder as the node nears it instead of the
// kernel killing the container: --memory-limit if given (flag, in
// GOMEMLIMIT's syntax); else none of ours when the GOMEMLIMIT variable is
// set (the runtime applies it); else 90% of the container's cgroup memory
// limit, read through readFile, leaving room for what the Go runtime does
// not count (stacks of threads, cgo, the binary). It returns 0 when no
// limit is to be set, and where the limit comes from.
func memoryLimit(flag string, getenv func(string) string, readFile func(string) ([]byte, error)) (int64, string, error) {
	if flag != "" {
		n, err := parseBytes(flag)
		if err != nil {
			return 0, "", fmt.Errorf("--memory-limit: %w", err)
		}
		return n, "--memory-limit", nil
	}
	if getenv("GOMEMLIMIT") != "" {
		return 0, "GOMEMLIMIT", nil
	}
	for _, path := range cgroupMemoryFiles {
		b, err := readFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, "", fmt.Errorf("container memory limit: %w", err)
		}
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(s, 10, 64)
		switch {
		case s == "max", err == nil && n >= 1<<62: // no limit (v2, v1)
			return 0, path, nil
		case err != nil || n <= 0:
			return 0, "", fmt.Errorf("container memory limit: %s: %q is not a number of bytes", path, s)
		}
		return n / 10 * 9, path, nil
	}
	return 0, "none", nil
}

// parseBytes reads a size as GOMEMLIMIT writes it: a whole number of
// bytes with an optional unit B, KiB, MiB, GiB or TiB.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}, {"B", 0}}
	num, shift := s, uint(0)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = rest, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q: want a positive number of bytes with an optional unit B, KiB, MiB, GiB or TiB", s)
	}
	return n << shift, nil
}
