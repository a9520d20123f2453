package main

import "syscall"

// sysProcAttr puts a server in its own process group and has the kernel kill
// it if this process dies without stopping it (kill -9, a crash).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
