package redisconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Redis user's rights
//
// An ACL user may lack a command or a channel the module uses, and Redis
// says so only when the command runs: a decision refused NOPERM takes the
// fail mode, a reset announcement refused is lost. So the start-up check
// tries each command once, in forms that change nothing (a script that does
// not compile, a hash no script has, an empty heartbeat, which listeners
// ignore): Redis checks a user's rights before it looks at the arguments,
// so NOPERM means refused and any other answer allowed. ACL DRYRUN would
// say the same without the tries, but a least-privilege user may not run
// it, and Redis 6 has none. A user with every right pays one round trip
// and one pub/sub subscription, once per handler at start-up.

// Rights is what Redis let this connection's user do, from Rights.
type Rights struct {
	// User is the ACL user ("default" where the URL names none).
	User string
	// Library: FCALL and FUNCTION LOAD (Redis 7 and later).
	Library bool
	// EvalSHA, ScriptLoad and Eval: the script commands.
	EvalSHA, ScriptLoad, Eval bool
	// Keys: the keys of the key prefix named to Rights.
	Keys bool
	// Unscripted names the commands the script calls that the user may
	// not run: a script runs with its caller's rights.
	Unscripted []string
	// Publish and Subscribe: the reset and heartbeat channels.
	Publish, Subscribe bool
	// Info: the evictions watch. ScriptExists: the connections opened
	// ahead of a far Redis's calls.
	Info, ScriptExists bool
}

// channelsPattern covers every channel the module uses.
const channelsPattern = "sliding_ratelimit:*"

// Rights tries, once, each command the module sends with this connection's
// user, on a key of keyPrefix. An error says that Redis could not be asked
// (it stopped answering, or a command failed in a way that says nothing of
// rights).
func (c *Conn) Rights(timeout time.Duration, keyPrefix string) (Rights, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, checkTimeout))
	defer cancel()
	client := c.s.client
	r := Rights{User: username(client)}
	const noSHA = "0000000000000000000000000000000000000000"
	key := keyPrefix + "{rights-probe}"
	// FUNCTION LOAD without a library: refused for its missing metadata
	// where the user may run it.
	var functionLoad bool
	type try struct {
		// right is had only if every try of it passes; nil: a command
		// of the script.
		right *bool
		args  []any
	}
	tries := []try{
		{&r.Library, []any{"fcall", "srl_rights_probe", 0}},
		{&functionLoad, []any{"function", "load", ""}},
		{&r.EvalSHA, []any{"evalsha", noSHA, 0}},
		{&r.Keys, []any{"evalsha", noSHA, 1, key}},
		{&r.ScriptLoad, []any{"script", "load", "("}},
		{&r.Eval, []any{"eval", "(", 0}},
		{&r.Publish, []any{"publish", instanceChannel, ""}},
		{&r.Publish, []any{"publish", resetChannel, ""}},
		{&r.Info, []any{"info", "server"}},
		{&r.ScriptExists, []any{"script", "exists", noSHA}},
	}
	for _, args := range scriptProbes(key) {
		tries = append(tries, try{nil, args})
	}
	cmds := make([]*redis.Cmd, len(tries))
	pipe := client.Pipeline()
	for i, t := range tries {
		cmds[i] = redis.NewCmd(ctx, t.args...)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	tried := map[*bool]bool{}
	for i, t := range tries {
		allowed, err := permitted(cmds[i].Err())
		switch name := t.args[0].(string); {
		case err != nil:
			return Rights{}, fmt.Errorf("checking the rights of redis user %s: %s: %w", r.User, name, err)
		case t.right == nil:
			if !allowed && !slices.Contains(r.Unscripted, name) {
				r.Unscripted = append(r.Unscripted, name)
			}
		default:
			*t.right = allowed && (!tried[t.right] || *t.right)
			tried[t.right] = true
		}
	}
	r.Library = r.Library && functionLoad
	r.Keys = r.Keys || !r.EvalSHA // only EVALSHA tells keys apart
	var err error
	if r.Subscribe, err = maySubscribe(ctx, client); err != nil {
		return Rights{}, fmt.Errorf("checking the rights of redis user %s: subscribe: %w", r.User, err)
	}
	return r, nil
}

// scriptCommands are the commands limit.lua calls (a test holds the list
// against it).
var scriptCommands = []string{"bitop", "del", "getrange", "hmget", "hset", "pexpire", "rename", "set", "setrange",
	"time", "zadd", "zcount", "zrange", "zrangebyscore", "zrem", "zremrangebyscore", "zscore"}

// scriptProbes are tries of each of scriptCommands on key, which does not
// exist: they change nothing but HSET's, which PEXPIRE and DEL then undo.
func scriptProbes(key string) [][]any {
	return [][]any{
		{"bitop", "or", key + "~", key},
		{"getrange", key, 0, 0},
		{"hmget", key, "w"},
		{"pexpire", key, 1},
		{"rename", key, key + "~"}, // "no such key", once allowed
		{"set", key, "", "xx"},
		{"setrange", key, 0, ""},
		{"time"},
		{"zadd", key, "xx", 0, "m"},
		{"zcount", key, 0, 0},
		{"zrange", key, 0, 0},
		{"zrangebyscore", key, 0, 0},
		{"zrem", key, "m"},
		{"zremrangebyscore", key, 0, 0},
		{"zscore", key, "m"},
		{"hset", key, "w", 0},
		{"pexpire", key, 1},
		{"del", key},
	}
}

// permitted reads a try's error: nil where the user may run the command,
// false where Redis refused it for the user's rights or does not have it,
// and an error where the try failed for another reason.
func permitted(err error) (bool, error) {
	var reply redis.Error
	switch {
	case err == nil:
		return true, nil
	case !errors.As(err, &reply):
		return false, err
	case strings.HasPrefix(reply.Error(), "NOPERM"), strings.HasPrefix(reply.Error(), "ERR unknown command"):
		return false, nil
	}
	for _, prefix := range transientReplies {
		if strings.HasPrefix(reply.Error(), prefix) {
			return false, err
		}
	}
	return true, nil
}

// maySubscribe subscribes to the module's channels and leaves them.
func maySubscribe(ctx context.Context, client redis.UniversalClient) (bool, error) {
	ps := client.Subscribe(ctx, resetChannel, instanceChannel)
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return permitted(err)
}

// username is the ACL user client authenticates as.
func username(client redis.UniversalClient) string {
	var name string
	switch c := client.(type) {
	case *redis.Client:
		name = c.Options().Username
	case *redis.ClusterClient:
		name = c.Options().Username
	}
	if name == "" {
		return "default"
	}
	return name
}

// Refusal is the reason no decision can be made with these rights on the
// keys of keyPrefix, with the ACL rule that gives the missing ones; "" when
// decisions can be made.
func (r Rights) Refusal(keyPrefix string) string {
	switch {
	case !r.Library && !(r.EvalSHA && (r.ScriptLoad || r.Eval)):
		return fmt.Sprintf("redis user %s may not run the rate limit script: it needs EVALSHA and SCRIPT LOAD (or FCALL and FUNCTION LOAD), so every decision would fail; "+
			"add them: ACL SETUSER %s +evalsha +script|load (docs/redis.md, Rights)", r.User, r.User)
	case !r.Keys:
		return fmt.Sprintf("redis user %s may not use the limiter's keys (key_prefix %s), so every decision would fail; "+
			"add them: ACL SETUSER %s ~%s* (docs/redis.md, Rights)", r.User, keyPrefix, r.User, keyPrefix)
	case len(r.Unscripted) > 0:
		return fmt.Sprintf("redis user %s may not run %s, which the rate limit script calls (a script runs with its caller's rights), so every decision would fail; "+
			"add them: ACL SETUSER %s +%s (docs/redis.md, Rights)", r.User, strings.ToUpper(strings.Join(r.Unscripted, ", ")), r.User, strings.Join(r.Unscripted, " +"))
	}
	return ""
}

// Warnings say, one line each, what works worse with these rights, what it
// costs, and the ACL rule that mends it.
func (r Rights) Warnings() []string {
	var out []string
	rule := func(what string) string {
		return fmt.Sprintf("; to allow it: ACL SETUSER %s %s (docs/redis.md, Rights)", r.User, what)
	}
	if !r.Publish || !r.Subscribe {
		out = append(out, fmt.Sprintf("redis user %s may not publish or subscribe to the channels %s: "+
			"an admin reset and a count_status refund are not told to other instances, whose deny caches keep refusing the client until its retry time, "+
			"and the instances never hear each other, so with fail_mode local each hands out the whole limit during an outage as if it were alone",
			r.User, channelsPattern)+rule("+publish +subscribe &"+channelsPattern))
	}
	if r.Library && !(r.EvalSHA && (r.ScriptLoad || r.Eval)) {
		out = append(out, fmt.Sprintf("redis user %s may not run the rate limit script by its hash (EVALSHA, SCRIPT LOAD): "+
			"when redis loses the library (a restart without persistence, FUNCTION FLUSH), decisions fail until it is loaded again, up to 5s later", r.User)+
			rule("+evalsha +script|load"))
	}
	if !r.Library && !r.ScriptLoad && r.EvalSHA && r.Eval {
		out = append(out, fmt.Sprintf("redis user %s may run neither FUNCTION nor SCRIPT LOAD: "+
			"the 30 KB script is sent whole (EVAL) whenever redis dropped it from its EVAL cache, which Redis 7.4 and later and Valkey 8 do when other clients run many scripts", r.User)+
			rule("+script|load"))
	}
	if !r.Info {
		out = append(out, fmt.Sprintf("redis user %s may not run INFO: evictions, each of which restarts a client's limit, are neither counted nor logged, "+
			"and redis's memory policy is not checked", r.User)+rule("+info"))
	}
	if !r.ScriptExists {
		out = append(out, fmt.Sprintf("redis user %s may not run SCRIPT EXISTS: connections to a far redis are not opened ahead of the calls that need them", r.User)+
			rule("+script|exists"))
	}
	return out
}
