//go:build !linux

package e2e

import (
	"errors"
	"time"
)

// processCPU is only measured on Linux, from /proc.
func processCPU(int) (time.Duration, error) {
	return 0, errors.New("process CPU is read from /proc, on Linux only")
}
