package main

import "syscall"

// sysProcAttr makes a started server die with this program, so that a
// program killed outright leaves no rlnode or redis-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
