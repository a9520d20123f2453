//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts a server in its own process group (no parent-death signal
// outside Linux: stop() is what stops it).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
