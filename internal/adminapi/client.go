package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// clientTimeout bounds one admin call of the command. A reset may wait
// for several stores and for its announcement to come back, a second each.
const clientTimeout = 30 * time.Second

// bodyLimit bounds what the command reads of an answer; the blocked
// list is the largest, about 150 bytes a client.
const bodyLimit = 64 << 20

// Request sends one request to the admin API at addr, a Caddy network
// address (localhost:2019, unix//run/caddy.sock), and returns the body of a
// successful answer. An answer with an error status becomes an error holding
// the admin API's message. It dials as caddycmd.AdminAPIRequest does, but
// keeps the status and the message apart, which that one joins in one text.
func Request(addr, method, path string) ([]byte, error) {
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil || na.PortRangeSize() > 1 {
		return nil, fmt.Errorf("invalid admin address %s: want one address, such as %s", addr, caddy.DefaultAdminListen)
	}
	origin := "http://" + na.JoinHostPort(0)
	if na.IsUnixNetwork() || na.IsFdNetwork() {
		// Any host does; the admin server checks that it is a local one.
		origin = "http://127.0.0.1"
		// A unix address may end in "|<permission bits>", which is not part
		// of the path.
		na.Host, _, _ = strings.Cut(na.Host, "|")
	}
	req, err := http.NewRequest(method, origin+path, nil)
	if err != nil {
		return nil, fmt.Errorf("making the request: %w", err)
	}
	if !na.IsUnixNetwork() && !na.IsFdNetwork() {
		req.Header.Set("Origin", origin)
	}
	client := http.Client{
		Timeout: clientTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, na.Network, na.JoinHostPort(0))
			},
		},
	}
	defer client.CloseIdleConnections()
	res, err := client.Do(req)
	if err != nil {
		// The method and URL the url.Error adds are ours, not news.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("no Caddy admin API answers at %s (is Caddy running, with this admin address? see --address and --config): %w", addr, err)
	}
	defer res.Body.Close()
	return readAnswer(res, addr, path)
}

// readAnswer returns the body of an admin API answer, or its error as
// the admin API's own message.
func readAnswer(res *http.Response, addr, path string) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(res.Body, bodyLimit))
	if err != nil {
		return nil, fmt.Errorf("reading the admin API's answer: %w", err)
	}
	if res.StatusCode >= http.StatusBadRequest {
		var answer struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &answer) == nil && answer.Error != "" {
			return nil, errors.New(answer.Error)
		}
		if res.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("the admin API at %s has no %s: is the sliding_ratelimit module in this Caddy?", addr, path)
		}
		return nil, fmt.Errorf("admin API: %s: %s", res.Status, strings.TrimSpace(string(body)))
	}
	return body, nil
}
