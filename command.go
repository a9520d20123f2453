package slidingratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

// The `caddy sliding-ratelimit` command talks to a running Caddy's admin API
// (admin.go), as `caddy reload` and `caddy stop` do: it finds the admin
// address the same way, sends one request and prints the answer.

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "sliding-ratelimit",
		Usage: "zones | status|reset --zone <zone> --key <key> | blocked [--limit <n>]",
		Short: "Shows, lists and resets the clients sliding_ratelimit limits",
		Long: `
Reads and changes the state of sliding_ratelimit in a running Caddy through
its admin API, which must be enabled.

  zones                              the zones of the running handlers: name,
                                     identity, limit, window, unit, algorithm
                                     and key
  status --zone <zone> --key <key>   a client's units used and left (requests,
                                     content-bytes, units or usd-micros) and
                                     wait in a zone; in a zone whose calls
                                     settle, what is used of the limit (in
                                     dollars with prices, or tokens), what
                                     calls running on this instance hold
                                     reserved and what is spent; the wait of
                                     a request now (a zone with a wait), the
                                     leases held (a concurrency zone) and the
                                     period and when it resets (a zone with a
                                     day, week or month); records nothing
  reset  --zone <zone> --key <key>   forgets the client's requests in a zone,
                                     on every instance that shares the store
  blocked [--limit <n>]              the clients this instance holds as blocked,
                                     the longest wait first (default 100)

<zone> is a zone's name ("default" for the top-level window and
max_requests), or its identity where handlers have zones of that name
that count apart (as the zones subcommand shows it: Caddyfile.example's
are "default@/api/*" and "login:401,403"). <key> is the client key as the
zone builds it: a client address (127.0.0.1, or 2001:db8::/64 with the default
ipv6_prefix) or a value of the zone's key ("Bearer abc"); "=" before a
value names a value that looks like an address, and a hashed key ("#...")
is taken as it is. The command escapes the key for the URL.

Every subcommand takes:
  --address <interface>  the admin API address (default ` + caddy.DefaultAdminListen + `)
  --config <path>        a config to read the admin address from, if
                         --address is not given
  --adapter <name>       the adapter of --config
  --json                 print the admin API's JSON answer as it is

An error from the admin API (an unknown zone, say) is printed as its
message, with a non-zero exit status.`,
		CobraFunc: buildSlidingRatelimitCommand,
	})
}

// buildSlidingRatelimitCommand adds the subcommands.
func buildSlidingRatelimitCommand(cmd *cobra.Command) {
	// Without a subcommand, the help; with a word that is none, an error
	// that suggests one (cobra would print the help and exit 0, so that a
	// script with a typo would think it worked).
	cmd.Args = cobra.ArbitraryArgs
	// The flags of the subcommand meant (stat --zone z) must not hide the
	// misspelt word behind an "unknown flag" error.
	cmd.FParseErrWhitelist.UnknownFlags = true
	cmd.SuggestionsMinimumDistance = 2
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown subcommand %q of caddy sliding-ratelimit", args[0])
		if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
			msg += " (did you mean " + strings.Join(suggestions, " or ") + "?)"
		}
		return errors.New(msg + "; run caddy sliding-ratelimit --help for the list")
	}
	zones := &cobra.Command{
		Use:   "zones",
		Short: "Lists the zones of the running handlers",
		Args:  cobra.NoArgs,
		RunE:  commandRunner(cmdZones),
	}
	status := &cobra.Command{
		Use:   "status --zone <zone> --key <key>",
		Short: "Shows a client's state in a zone",
		Args:  cobra.NoArgs,
		RunE:  commandRunner(cmdStatus),
	}
	reset := &cobra.Command{
		Use:   "reset --zone <zone> --key <key>",
		Short: "Resets a client in a zone, on every instance",
		Args:  cobra.NoArgs,
		RunE:  commandRunner(cmdReset),
	}
	for _, sub := range []*cobra.Command{status, reset} {
		sub.Flags().String("zone", "", "Zone name, or identity")
		sub.Flags().String("key", "", "Client key, as the zone builds it")
		_ = sub.MarkFlagRequired("zone")
		_ = sub.MarkFlagRequired("key")
	}
	blocked := &cobra.Command{
		Use:   "blocked [--limit <n>]",
		Short: "Lists the clients this instance holds as blocked",
		Args:  cobra.NoArgs,
		RunE:  commandRunner(cmdBlocked),
	}
	limit := listLimit(adminapi.BlockedDefaultLimit)
	blocked.Flags().Var(&limit, "limit", "Most clients to list, the longest wait first")
	for _, sub := range []*cobra.Command{zones, status, reset, blocked} {
		adminFlags(sub)
		cmd.AddCommand(sub)
	}
}

// listLimit is the value of blocked's --limit: a whole number of at least
// 1. The admin API's limit=0 (the count alone) is not offered, since the
// table would be empty; every listing ends with the count.
type listLimit int

func (l *listLimit) String() string { return strconv.Itoa(int(*l)) }

// Type names the value in the help: --limit n.
func (l *listLimit) Type() string { return "n" }

// Set reads the flag; cobra prints its error after `invalid argument "<value>"
// for "--limit" flag: `.
func (l *listLimit) Set(arg string) error {
	n, err := strconv.Atoi(arg)
	switch {
	case err != nil && errors.Is(err, strconv.ErrRange):
		return fmt.Errorf("--limit is too large (at most %d)", math.MaxInt)
	case err != nil:
		return errors.New("--limit must be a whole number of at least 1, the most clients to list")
	case n < 1:
		return errors.New("--limit must be at least 1, the most clients to list (the count of all blocked clients ends every listing)")
	}
	*l = listLimit(n)
	return nil
}

// adminFlags adds the flags that find and read the admin API, named as in
// Caddy's own commands.
func adminFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.String("address", "", "The address of the admin API, if not the default")
	fs.StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	fs.StringP("adapter", "a", "", "Name of config adapter to apply (when --config is used)")
	fs.Bool("json", false, "Print the admin API's JSON answer")
}

// commandRunner runs f as a command that prints to the command's output.
// An error is returned to cobra, which prints it as "Error: <message>" and
// makes caddy exit with status 1: a person reads it, so it is not a JSON log
// line (what caddycmd.WrapCommandFuncForCobra would make of it).
func commandRunner(f func(caddycmd.Flags, io.Writer) (int, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		_, err := f(caddycmd.Flags{FlagSet: cmd.Flags()}, cmd.OutOrStdout())
		return err
	}
}

func cmdZones(fl caddycmd.Flags, out io.Writer) (int, error) {
	return callAdmin(fl, out, "GET", adminapi.ZonesPath, func(tw io.Writer, body []byte) error {
		var a adminapi.ZonesAnswer
		if err := json.Unmarshal(body, &a); err != nil {
			return err
		}
		if len(a.Zones) == 0 {
			fmt.Fprintln(tw, "no sliding_ratelimit handler is running")
			return nil
		}
		fmt.Fprintln(tw, "ZONE\tIDENTITY\tLIMIT\tWINDOW\tUNIT\tALGORITHM\tKEY")
		for _, z := range a.Zones {
			limit := strconv.FormatInt(z.Limit, 10)
			if z.LimitUSD != "" {
				limit += " ($" + z.LimitUSD + ")"
			}
			if z.LimitFrom != "" {
				limit = z.LimitFrom + " (fallback " + limit + ")"
			}
			window := "-"
			if z.WindowSeconds > 0 {
				window = seconds(z.WindowSeconds)
			}
			if z.Period != nil {
				// A calendar period: its name and time zone.
				window = z.Period.Name + "(" + z.Period.TimeZone + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(z.Name), cell(z.Identity), cell(limit), window,
				cell(z.Unit), cell(z.Algorithm), cell(z.Key))
		}
		return nil
	})
}

func cmdStatus(fl caddycmd.Flags, out io.Writer) (int, error) {
	path, err := keyPath(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	return callAdmin(fl, out, "GET", path, func(tw io.Writer, body []byte) error {
		var s adminapi.KeyState
		if err := json.Unmarshal(body, &s); err != nil {
			return err
		}
		fmt.Fprintln(tw, "ZONE\tIDENTITY\tKEY\tCOUNT\tREMAINING\tUNIT\tRESET\tRETRY AFTER")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", cell(s.Zone), cell(s.Identity), cell(s.Key),
			s.Count, s.Remaining, cell(s.Unit), seconds(s.ResetSeconds), seconds(s.RetryAfterSeconds))
		printWaitAndLeases(tw, s)
		return nil
	})
}

// printWaitAndLeases adds, below the status table, the limit the figures
// count against where each tenant has its own (and where it comes from),
// the budget used, reserved and spent in a zone whose calls settle, the
// wait of a request now in a zone with a wait, the leases held in a
// concurrency zone, and the period and when it resets in a zone with a
// period.
func printWaitAndLeases(tw io.Writer, s adminapi.KeyState) {
	if s.LimitFrom != "" {
		// SOURCE: last_decision (the client's own) or fallback (not known).
		fmt.Fprintf(tw, "\nLIMIT\tFROM\tSOURCE\n%d\t%s\t%s\n", s.Limit, cell(s.LimitFrom), cell(s.LimitSource))
	}
	if line := budgetLine(s); line != "" {
		fmt.Fprintf(tw, "\n%s\n", line)
	}
	if s.WaitSeconds != nil {
		fmt.Fprintf(tw, "\nWAIT NOW\n%s\n", seconds(*s.WaitSeconds))
	}
	if s.LeasesHeld != nil && s.LeasesHeldHere != nil {
		fmt.Fprintf(tw, "\nLEASES HELD\tON THIS INSTANCE\n%d\t%d\n", *s.LeasesHeld, *s.LeasesHeldHere)
	}
	if p := s.Period; p != nil {
		fmt.Fprintf(tw, "\nPERIOD\tTIME ZONE\tSTARTED\tRESETS AT\n%s\t%s\t%s\t%s\n", cell(p.Name), cell(p.TimeZone), cell(p.Start), cell(p.End))
	}
}

func cmdReset(fl caddycmd.Flags, out io.Writer) (int, error) {
	path, err := keyPath(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	return callAdmin(fl, out, "DELETE", path, func(tw io.Writer, body []byte) error {
		var r adminapi.ResetAnswer
		if err := json.Unmarshal(body, &r); err != nil {
			return err
		}
		fmt.Fprintln(tw, "ZONE\tKEY\tRESET")
		fmt.Fprintf(tw, "%s\t%s\t%t\n", cell(r.Zone), cell(r.Key), r.Reset)
		if r.Unannounced != "" {
			fmt.Fprintf(tw, "not announced to the other instances, whose deny caches may refuse the client until its wait ends: %s\n", cell(r.Unannounced))
		}
		return nil
	})
}

func cmdBlocked(fl caddycmd.Flags, out io.Writer) (int, error) {
	path := adminapi.BlockedPath + "?limit=" + fl.String("limit")
	return callAdmin(fl, out, "GET", path, func(tw io.Writer, body []byte) error {
		var b adminapi.BlockedAnswer
		if err := json.Unmarshal(body, &b); err != nil {
			return err
		}
		if b.Count == 0 {
			fmt.Fprintln(tw, "no client is blocked on this instance")
			return nil
		}
		fmt.Fprintln(tw, "ZONE\tIDENTITY\tKEY\tRETRY AFTER")
		for _, c := range b.Blocked {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(c.Zone), cell(c.Identity), cell(c.Key), seconds(c.RetryAfterSeconds))
		}
		fmt.Fprintf(tw, "%d blocked, %d listed\n", b.Count, len(b.Blocked))
		return nil
	})
}

// keyPath is the admin path of the --zone and --key flags, escaped as the
// admin API reads it (see AdminAPI).
func keyPath(fl caddycmd.Flags) (string, error) {
	zone, key := fl.String("zone"), fl.String("key")
	if zone == "" || key == "" {
		return "", errors.New("--zone and --key must not be empty")
	}
	return "/sliding_ratelimit/zones/" + url.PathEscape(zone) + "/keys/" + escapeKey(key), nil
}

// escapeKey escapes a client key for the admin path. PathEscape escapes '/',
// '%', '?' and '#', which leaves the key one path segment; that segment
// must not be "." or "..", which the admin server would clean away.
func escapeKey(key string) string {
	if key == "." || key == ".." {
		return strings.ReplaceAll(key, ".", "%2E")
	}
	return url.PathEscape(key)
}

// callAdmin sends the request to the admin API the flags name and prints
// the answer: as it is with --json, else through table.
func callAdmin(fl caddycmd.Flags, out io.Writer, method, path string, table func(io.Writer, []byte) error) (int, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("finding the admin API address: %w", err)
	}
	body, err := adminapi.Request(addr, method, path)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if fl.Bool("json") {
		_, err := out.Write(body)
		return exitCode(err), err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if err := table(tw, body); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("reading the admin API's answer: %w", err)
	}
	err = tw.Flush()
	return exitCode(err), err
}

// exitCode is the exit status of a command that ended with err.
func exitCode(err error) int {
	if err != nil {
		return caddy.ExitCodeFailedStartup
	}
	return caddy.ExitCodeSuccess
}

// seconds formats seconds from the admin API for people: to the tenth of a
// second, or to the millisecond below one.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// cell is s for a table cell: quoted if it holds a space or a character
// that is not printable, which would shift the columns.
func cell(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// budgetLine is, in a zone whose calls settle or that counts money, what
// the client used of its limit, split into what the calls running on the
// instance that answered hold reserved and what is spent, and what is
// left, in dollars or in the zone's units (tokens where they are):
//
//	used $4.550000 of $10.000000: $0.050000 reserved by calls running on this instance, $4.500000 spent; $5.450000 left
//	used 1,234 of 100,000 tokens: 300 reserved by calls running on this instance, 934 spent; 98,766 left
//
// It is "" in other zones, whose table says it all.
func budgetLine(s adminapi.KeyState) string {
	money := s.Unit == unitUSDMicros
	if s.Reserved == nil && !money {
		return ""
	}
	figure, unit := grouped, " "+s.Unit
	if money {
		figure, unit = dollars, ""
	}
	if s.Tokens {
		unit = " tokens"
	}
	line := "used " + figure(s.Count) + " of " + figure(s.Limit) + unit
	if s.Reserved != nil && s.Spent != nil {
		line += ": " + figure(*s.Reserved) + " reserved by calls running on this instance, " + figure(*s.Spent) + " spent"
	}
	return line + "; " + figure(s.Remaining) + " left"
}

// dollars writes µ$ as dollars to the µ$, so that figures line up:
// 4500000 is "$4.500000".
func dollars(micros int64) string {
	sign := ""
	if micros < 0 {
		sign, micros = "-", -micros
	}
	return fmt.Sprintf("%s$%d.%06d", sign, micros/1_000_000, micros%1_000_000)
}

// grouped writes n with its thousands apart: 100000 is "100,000".
func grouped(n int64) string {
	digits := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, digits = "-", digits[1:]
	}
	var b strings.Builder
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return sign + b.String()
}
