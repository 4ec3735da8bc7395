package e2e

import "syscall"

// sysProcAttr makes a node die with the test process, so that a test
// binary killed by a timeout leaves no rlnode behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
