package command

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline/apiclient"
)

// runCommandsSkipBatch is `onceflow commands skip-batch`: the admin
// route POST /status/skip-batch of the processor blocked at a batch too
// large to decompress (processor.SkipBatch), as `onceflow projections
// skip` is for a projector. The DLQ record says who skipped: the admin
// token's identity, with the name from -operator or $USER as what the
// operator says (admin.Who).
func runCommandsSkipBatch(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var aggregate, note, operator string
	c, fs, err := parse("commands skip-batch", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&aggregate, "aggregate-type", "", "the aggregate type whose commands topic is blocked, DOMAIN/TYPE (default: the only one)")
		fs.StringVar(&note, "note", "", "why the batch is skipped (required; kept in its DLQ record)")
		fs.StringVar(&operator, "operator", getenv("USER"), "your name, kept in its DLQ record as what you say next to who the admin token proves (admin-token)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 2 || note == "" {
		return fmt.Errorf("usage: onceflow commands skip-batch -note WHY [-operator NAME] [-admin-addr HOST:PORT] PARTITION OFFSET (the batch's offset: onceflow lag shows batch-too-large@OFFSET)")
	}
	part, off, err := partitionOffset(fs)
	if err != nil {
		return err
	}
	if c.AdminToken == "" {
		return fmt.Errorf("ONCEFLOW_ADMIN_TOKEN (or ONCEFLOW_ADMIN_TOKEN_FILE) is required: the processor's admin token")
	}
	dep, err := c.Deployment()
	if err != nil {
		return err
	}
	at, err := dep.FindAggregate(aggregate)
	if err != nil {
		return err
	}
	topic := at.Topics.Commands()
	body, err := json.Marshal(map[string]any{"topic": topic, "partition": part, "offset": off, "note": note, "operator": operator})
	if err != nil {
		return err
	}
	url := adminURL(c.AdminAddr) + "/status/skip-batch"
	// The processor answers once the skip's transaction has ended: within
	// its 30 s, unless the request never reached it.
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.AdminToken)
	resp, err := http.DefaultClient.Do(req) // #nosec G704 -- the operator's own admin address
	if err != nil {
		return fmt.Errorf("reach the processor's admin address (-admin-addr, ADMIN_ADDR): %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("read the processor's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var p apiclient.Problem
		if json.Unmarshal(b, &p) != nil || p.Detail == "" {
			p.Detail = plain(strings.TrimSpace(string(b)))
		}
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusConflict {
			return fmt.Errorf("nothing skipped: %s (%d); `onceflow lag` marks a blocked partition batch-too-large@OFFSET, and the HOST of the processor that holds it", p.Detail, resp.StatusCode)
		}
		return fmt.Errorf("nothing skipped: %s refused (%d %s): %s", url, resp.StatusCode, http.StatusText(resp.StatusCode), p.Detail)
	}
	var res struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.Message == "" {
		return fmt.Errorf("the processor's answer is not a skip's: %s", plain(string(b)))
	}
	fmt.Fprintf(stdout, "%s: %s\n", res.Message, note)
	return nil
}

// adminURL is the base URL of an admin address as ADMIN_ADDR names it
// (":9090", "host:9090") or a URL; a missing host is this one.
func adminURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	if addr == "" {
		addr = onceflow.DevAdminAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
