package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server when the test binary dies,
// so a test that panics or times out leaves no redis-server behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
