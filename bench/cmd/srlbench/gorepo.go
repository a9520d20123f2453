package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// goInRepo runs the go command with args in the repository (the phases
// that read one of its Go benchmarks), and returns what it printed, or an
// error that says the command and the end of its output.
func goInRepo(ctx context.Context, cfg config, args []string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = cfg.repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, truncate(strings.TrimSpace(tailLines(string(out), 5)), 300))
	}
	return string(out), nil
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
