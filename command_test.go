package slidingratelimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// caddyMainEnv makes the test binary run as the caddy command (caddycmd.Main,
// as a Caddy built with this module does), so that a test can run it as a
// separate process and see its output and exit status.
const caddyMainEnv = "SLIDING_RATELIMIT_TEST_CADDY_MAIN"

func init() {
	if os.Getenv(caddyMainEnv) == "1" {
		caddycmd.Main()
		os.Exit(0)
	}
}

// runCaddy runs the caddy command in a process of its own and returns its
// output (stdout and stderr) and exit status.
func runCaddy(t *testing.T, args ...string) (string, int) {
	t.Helper()
	// Not os.Args[0]: caddytest sets it to "caddy".
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), caddyMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("running caddy %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// runCommand runs `caddy sliding-ratelimit args...` in this process, as
// Caddy's command line would, and returns what it printed and its error.
func runCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	registered, ok := caddycmd.Commands()["sliding-ratelimit"]
	if !ok {
		t.Fatal("the sliding-ratelimit command is not registered")
	}
	root := &cobra.Command{Use: "caddy", SilenceUsage: true, SilenceErrors: true}
	cmd := &cobra.Command{Use: registered.Name + " " + registered.Usage, Short: registered.Short, Long: registered.Long}
	registered.CobraFunc(cmd)
	root.AddCommand(cmd)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"sliding-ratelimit"}, args...))
	err := root.Execute()
	return out.String(), err
}

// commandJSON runs the command with --json and decodes what it printed.
func commandJSON[T any](t *testing.T, args ...string) T {
	t.Helper()
	out, err := runCommand(t, append(args, "--json", "--address", "localhost:2999")...)
	if err != nil {
		t.Fatalf("sliding-ratelimit %s: %v; printed %s", strings.Join(args, " "), err, out)
	}
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("sliding-ratelimit %s --json: %v in %q", strings.Join(args, " "), err, out)
	}
	return v
}

// commandSite is a site on :9080 keyed by the X-Client header, two requests
// a minute, on Redis.
func commandSite(t *testing.T) string {
	return siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone cmd_zone 1m 2
	}
	respond "ok"`)
}

func TestCommandSubcommands(t *testing.T) {
	startCaddy(t, commandSite(t))
	client := from("127.0.0.2")
	alice := map[string][]string{"X-Client": {"alice"}}
	expect(t, "alice", site, []int{200}, client, withHeaders(alice))

	s := commandJSON[adminapi.KeyState](t, "status", "--zone", "cmd_zone", "--key", "alice")
	if s.Key != "=alice" || s.Count != 1 || s.Remaining != 1 || s.Identity != "cmd_zone" {
		t.Errorf("status --json: %+v, want key =alice, count 1, remaining 1", s)
	}
	out, err := runCommand(t, "status", "--zone", "cmd_zone", "--key", "alice", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "ZONE IDENTITY KEY COUNT REMAINING UNIT RESET RETRY AFTER" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "cmd_zone cmd_zone =alice 1 1 requests ") ||
		!strings.HasSuffix(lines[1], " 0s") {
		t.Errorf("status printed:\n%s", out)
	}

	retry := denyUntilBlocked(t, site, client, withHeaders(alice))
	b := commandJSON[adminapi.BlockedAnswer](t, "blocked")
	if b.Count != 1 || len(b.Blocked) != 1 || b.Blocked[0].Key != "=alice" || b.Blocked[0].Zone != "cmd_zone" ||
		b.Blocked[0].RetryAfterSeconds > retry || b.Blocked[0].RetryAfterSeconds < retry-10 {
		t.Errorf("blocked --json: %+v, want =alice in cmd_zone waiting about %gs", b, retry)
	}
	out, err = runCommand(t, "blocked", "--address", "localhost:2999", "--limit", "5")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	fields := strings.Fields(lines[len(lines)/2])
	if len(lines) != 3 ||
		strings.Join(strings.Fields(lines[0]), " ") != "ZONE IDENTITY KEY RETRY AFTER" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "cmd_zone cmd_zone =alice ") ||
		lines[2] != "1 blocked, 1 listed" {
		t.Errorf("blocked printed:\n%s", out)
	} else if wait, err := time.ParseDuration(fields[len(fields)-1]); err != nil || wait > time.Minute || wait < 50*time.Second {
		t.Errorf("blocked printed a wait of %v (%v), want about a minute:\n%s", wait, err, out)
	}
	// The count alone is the admin API's (limit=0); the command always lists.
	var count adminapi.BlockedAnswer
	if res := send(t, adminURL+adminapi.BlockedPath+"?limit=0"); res.status != http.StatusOK || json.Unmarshal([]byte(res.body), &count) != nil ||
		count.Count != 1 || len(count.Blocked) != 0 {
		t.Errorf("GET %s?limit=0: %d %s, want a count of 1 and no entries", adminapi.BlockedPath, res.status, res.body)
	}

	out, err = runCommand(t, "reset", "--zone", "cmd_zone", "--key", "alice", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(out), " "); got != "ZONE KEY RESET cmd_zone =alice true" {
		t.Errorf("reset printed:\n%s", out)
	}
	expect(t, "alice after the reset", site, []int{200}, client, withHeaders(alice))
	if out, err := runCommand(t, "blocked", "--address", "localhost:2999"); err != nil || out != "no client is blocked on this instance\n" {
		t.Errorf("blocked after the reset: %q, %v", out, err)
	}
	if r := commandJSON[adminapi.ResetAnswer](t, "reset", "--zone", "cmd_zone", "--key", "alice"); r != (adminapi.ResetAnswer{Reset: true, Zone: "cmd_zone", Key: "=alice"}) {
		t.Errorf("reset --json: %+v", r)
	}
}

// TestCommandEscapesKeys: keys that are not plain path segments reach the
// admin API as they are.
func TestCommandEscapesKeys(t *testing.T) {
	startCaddy(t, commandSite(t))
	client := from("127.0.0.2")
	for _, key := range []string{"team/a/b", "a//b", "..", ".", "x/../y", "a b%c?d#e", "ключ", "x/keys/y", strings.Repeat("k", 100)} {
		expect(t, key, site, []int{200}, client, withHeader("X-Client", key))
		s := commandJSON[adminapi.KeyState](t, "status", "--zone", "cmd_zone", "--key", key)
		want := hashedKey("=" + key) // unchanged unless long or holding '#'
		if s.Key != want || s.Count != 1 {
			t.Errorf("status of %q: key %q count %d, want %q and 1", key, s.Key, s.Count, want)
		}
		if r := commandJSON[adminapi.ResetAnswer](t, "reset", "--zone", "cmd_zone", "--key", key); r.Key != want {
			t.Errorf("reset of %q: key %q, want %q", key, r.Key, want)
		}
	}
}

// TestCommandFindsTheAdminAddress: from --config, with or without
// --adapter, as caddy reload finds it.
func TestCommandFindsTheAdminAddress(t *testing.T) {
	startCaddy(t, commandSite(t))
	dir := t.TempDir()
	caddyfile := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(caddyfile, []byte(globalOptions+commandSite(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(config, []byte(`{"admin": {"listen": "localhost:2999"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--config", caddyfile, "--adapter", "caddyfile"},
		{"--config", caddyfile},
		{"--config", config},
	} {
		out, err := runCommand(t, append([]string{"status", "--zone", "cmd_zone", "--key", "bob", "--json"}, args...)...)
		var s adminapi.KeyState
		if err != nil || json.Unmarshal([]byte(out), &s) != nil || s.Key != "=bob" {
			t.Errorf("%v: %v, printed %q", args, err, out)
		}
	}
}

func TestCommandErrors(t *testing.T) {
	startCaddy(t, commandSite(t))
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nobody := "127.0.0.1:" + strconv.Itoa(port)
	// An admin API without the module answers its paths with a plain 404.
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	plainAddr := strings.TrimPrefix(plain.URL, "http://")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no caddy", []string{"blocked", "--address", nobody}, "no Caddy admin API answers at " + nobody},
		{"no caddy, status", []string{"status", "--zone", "z", "--key", "k", "--address", nobody}, "no Caddy admin API answers at " + nobody},
		{"unknown zone", []string{"status", "--zone", "nope", "--key", "k", "--address", "localhost:2999"}, `unknown zone "nope": no sliding_ratelimit handler has a zone of that name`},
		{"unknown zone, reset", []string{"reset", "--zone", "nope", "--key", "k", "--address", "localhost:2999"}, `unknown zone "nope"`},
		{"negative limit", []string{"blocked", "--limit", "-1", "--address", "localhost:2999"}, `invalid argument "-1" for "--limit" flag: --limit must be at least 1, the most clients to list`},
		{"zero limit", []string{"blocked", "--limit", "0", "--address", "localhost:2999"}, `invalid argument "0" for "--limit" flag: --limit must be at least 1, the most clients to list (the count of all blocked clients ends every listing)`},
		{"limit not a number", []string{"blocked", "--limit", "ten"}, `invalid argument "ten" for "--limit" flag: --limit must be a whole number of at least 1, the most clients to list`},
		{"limit too large", []string{"blocked", "--limit", "99999999999999999999"}, `--limit is too large`},
		{"no key", []string{"status", "--zone", "cmd_zone"}, `required flag(s) "key" not set`},
		{"no zone", []string{"reset", "--key", "k"}, `required flag(s) "zone" not set`},
		{"empty key", []string{"status", "--zone", "cmd_zone", "--key", ""}, "--zone and --key must not be empty"},
		{"unknown flag", []string{"blocked", "--zone", "z"}, "unknown flag: --zone"},
		{"argument", []string{"blocked", "extra"}, `unknown command "extra"`},
		{"no module", []string{"blocked", "--address", plainAddr}, "the admin API at " + plainAddr + " has no /sliding_ratelimit/blocked"},
		{"bad address", []string{"blocked", "--address", "localhost:1-9"}, "invalid admin address localhost:1-9"},
		{"missing config", []string{"blocked", "--config", filepath.Join(t.TempDir(), "nothing")}, "finding the admin API address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := runCommand(t, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, printed %q; want an error with %q", err, out, c.want)
			}
		})
	}
}

// TestCommandAsCaddy runs the command as a caddy binary would: help, exit
// statuses and error messages.
func TestCommandAsCaddy(t *testing.T) {
	startCaddy(t, commandSite(t))
	out, status := runCaddy(t, "help", "sliding-ratelimit")
	for _, want := range []string{"status --zone <zone> --key <key>", "reset  --zone <zone> --key <key>", "blocked [--limit <n>]", "--address", "--config", "--adapter", "--json", "escapes the key"} {
		if !strings.Contains(out, want) {
			t.Errorf("caddy help sliding-ratelimit: no %q in\n%s", want, out)
		}
	}
	if status != 0 {
		t.Errorf("caddy help sliding-ratelimit: exit status %d", status)
	}
	if out, status := runCaddy(t, "sliding-ratelimit", "blocked", "--address", "localhost:2999"); status != 0 || !strings.Contains(out, "no client is blocked") {
		t.Errorf("blocked: exit status %d, printed %s", status, out)
	}

	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sliding-ratelimit", "blocked", "--address", "127.0.0.1:" + strconv.Itoa(port)}, "no Caddy admin API answers at"},
		{[]string{"sliding-ratelimit", "status", "--zone", "nope", "--key", "k", "--address", "localhost:2999"}, "Error: unknown zone \"nope\": no sliding_ratelimit handler has a zone of that name; the zones are cmd_zone"},
		{[]string{"sliding-ratelimit", "status", "--zone", "cmd_zone"}, `required flag(s) "key" not set`},
	} {
		out, status := runCaddy(t, c.args...)
		if status == 0 || !strings.Contains(out, c.want) {
			t.Errorf("caddy %s: exit status %d, printed %s; want a failure with %q", strings.Join(c.args, " "), status, out, c.want)
		}
	}
}

// TestCommandPlainErrorsAndTypos: the command's errors are a line a person
// reads, not a JSON log entry; a misspelt subcommand fails and suggests the
// right one, instead of printing the help and exiting 0.
func TestCommandPlainErrorsAndTypos(t *testing.T) {
	startCaddy(t, zonesSite(t))
	out, status := runCaddy(t, "sliding-ratelimit", "status", "--zone", "nope", "--key", "k", "--address", "localhost:2999")
	if status == 0 || !strings.Contains(out, `Error: unknown zone "nope": no sliding_ratelimit handler has a zone of that name; the zones are api, reports, tenants`) ||
		strings.Contains(out, `"level"`) {
		t.Errorf("unknown zone: exit status %d, printed %s; want a plain error line", status, out)
	}
	for _, c := range []struct{ typo, want string }{
		{"stat", "did you mean status?"},
		{"rest", "did you mean reset?"},
		{"blockd", "did you mean blocked?"},
		{"zone", "did you mean zones?"},
		{"purge", "run caddy sliding-ratelimit --help for the list"},
	} {
		out, status := runCaddy(t, "sliding-ratelimit", c.typo, "--zone", "api", "--key", "k")
		if status == 0 || !strings.Contains(out, `unknown subcommand "`+c.typo+`" of caddy sliding-ratelimit`) || !strings.Contains(out, c.want) {
			t.Errorf("caddy sliding-ratelimit %s: exit status %d, printed %s; want a failure with %q", c.typo, status, out, c.want)
		}
	}
	if out, status := runCaddy(t, "sliding-ratelimit"); status != 0 || !strings.Contains(out, "status --zone <zone> --key <key>") {
		t.Errorf("caddy sliding-ratelimit alone: exit status %d, printed %s; want the help", status, out)
	}
}
