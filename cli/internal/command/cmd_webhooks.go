package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/jobs"
	"github.com/onceflow/onceflow/pipeline/webhooks"
)

func runWebhooksList(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant string
	c, _, err := parse("webhooks list", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant (required)")
	})
	if err != nil {
		return err
	}
	if tenant == "" {
		return fmt.Errorf("usage: onceflow webhooks list -tenant TENANT")
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT id, url, event_types, status, coalesce(disabled_reason, ''), cardinality(secrets), failures,
		greatest(open_until - now(), '0'::interval) FROM webhook_subscriptions WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return err
	}
	defer rows.Close()
	tw := table(stdout, "ID\tURL\tEVENT TYPES\tSTATUS\tSECRETS\tFAILURES\tBREAKER")
	for rows.Next() {
		var id [16]byte
		var url, status, reason string
		var types []string
		var secrets, failures int
		var open time.Duration
		if err := rows.Scan(&id, &url, &types, &status, &reason, &secrets, &failures, &open); err != nil {
			return err
		}
		if reason != "" {
			status += " (" + reason + ")"
		}
		breaker := "closed"
		if open > 0 {
			breaker = fmt.Sprintf("open %s more", roundDur(open))
		}
		all := strings.Join(types, ",")
		if all == "" {
			all = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", pipeline.ID(id), url, all, status, secrets, failures, breaker)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What GET /v1/webhooks answers as "capped": the tenant at its cap of
	// deliveries in flight, its new events' deliveries waiting.
	capped, err := webhooks.TenantCapped(ctx, pool, tenant)
	if err != nil || capped == nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "\nCAPPED since %s (checked %s): %d deliveries in flight, at most %d: %s\n",
		capped.Since.Format(time.RFC3339), capped.CheckedAt.Format(time.RFC3339), capped.InFlight, capped.MaxPending, capped.Detail)
	return err
}

func runWebhooksDeliveries(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant, sub, status string
	var limit int
	c, _, err := parse("webhooks deliveries", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant (required)")
		fs.StringVar(&sub, "subscription", "", "only this subscription's")
		fs.StringVar(&status, "status", "", "only pending, delivered, failed or dead ones")
		fs.IntVar(&limit, "limit", 50, "at most this many, newest first")
	})
	if err != nil {
		return err
	}
	if tenant == "" {
		return fmt.Errorf("usage: onceflow webhooks deliveries -tenant TENANT [-subscription ID] [-status STATUS] [-limit N]")
	}
	f := webhooks.Filter{Tenant: tenant, Status: status, Limit: limit}
	if sub != "" {
		id, err := pipeline.ParseID(sub)
		if err != nil {
			return fmt.Errorf("-subscription: %w", err)
		}
		f.Subscription = &id
	}
	switch status {
	case "", "pending", "delivered", "failed", "dead":
	default:
		return fmt.Errorf("-status %q: want pending, delivered, failed or dead", status)
	}
	if limit < 1 {
		return fmt.Errorf("-limit %d: want 1 or more", limit)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	ds, err := webhooks.Deliveries(ctx, pool, f)
	if err != nil {
		return err
	}
	tw := table(stdout, "EVENT\tTYPE\tSUBSCRIPTION\tSTATUS\tATTEMPTS\tLAST\tPROJECTED\tDELIVERED\tKEY")
	for _, d := range ds {
		last := "-"
		switch {
		case d.LastError != nil:
			last = *d.LastError
		case d.LastStatus != nil:
			last = fmt.Sprint(*d.LastStatus)
		}
		delivered := "-"
		if d.Delivered != nil {
			delivered = fmt.Sprintf("+%s", roundDur(d.Delivered.Sub(d.CreatedAt)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.EventID, d.EventType, d.SubscriptionID, d.Status, d.Attempts, last,
			d.CreatedAt.UTC().Format(time.RFC3339), delivered, d.Key())
	}
	return tw.Flush()
}

func runWebhooksRedeliver(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var tenant, sub, event string
	var dead bool
	c, _, err := parse("webhooks redeliver", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&tenant, "tenant", "", "the tenant (required)")
		fs.StringVar(&sub, "subscription", "", "the subscription (required)")
		fs.StringVar(&event, "event", "", "the event id to send again")
		fs.BoolVar(&dead, "dead", false, "send every dead delivery of the subscription again")
	})
	if err != nil {
		return err
	}
	if tenant == "" || sub == "" || (event == "") == !dead {
		return fmt.Errorf("usage: onceflow webhooks redeliver -tenant TENANT -subscription ID (-event ID | -dead)")
	}
	subID, err := pipeline.ParseID(sub)
	if err != nil {
		return fmt.Errorf("-subscription: %w", err)
	}
	var events []pipeline.ID
	if event != "" {
		id, err := pipeline.ParseID(event)
		if err != nil {
			return fmt.Errorf("-event: %w", err)
		}
		events = append(events, id)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if dead {
		ds, err := webhooks.Deliveries(ctx, pool, webhooks.Filter{Tenant: tenant, Subscription: &subID, Status: "dead", Limit: 10000})
		if err != nil {
			return err
		}
		for _, d := range ds {
			events = append(events, d.EventID)
		}
	}
	var errs []error
	n := 0
	for _, ev := range events {
		if err := webhooks.Redeliver(ctx, pool, tenant, subID, ev); err != nil {
			errs = append(errs, fmt.Errorf("event %s: %w", ev, err))
			continue
		}
		n++
	}
	fmt.Fprintf(stdout, "redelivering %d deliveries (same webhook-id and Idempotency-Key as before)\n", n)
	return errors.Join(errs...)
}

func runJobsList(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	var state, kind string
	var limit int
	c, _, err := parse("jobs list", domains, args, getenv, stdout, func(fs *flag.FlagSet) {
		fs.StringVar(&state, "state", "", "only jobs in this River state (available, running, retryable, scheduled, completed, cancelled, discarded)")
		fs.StringVar(&kind, "kind", "", "only jobs of this kind (webhook_delivery)")
		fs.IntVar(&limit, "limit", 50, "at most this many, newest first")
	})
	if err != nil {
		return err
	}
	if limit < 1 {
		return fmt.Errorf("usage: onceflow jobs list [-state STATE] [-kind KIND] [-limit N]")
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT id, kind, state::text, attempt, max_attempts, coalesce(args->>'key', ''),
		coalesce(metadata->'output'->>'note', ''), coalesce(errors[array_upper(errors, 1)]->>'error', ''), created_at
		FROM river_job WHERE ($1 = '' OR state::text = $1) AND ($2 = '' OR kind = $2) ORDER BY id DESC LIMIT $3`, state, kind, limit)
	if err != nil {
		return err
	}
	defer rows.Close()
	tw := table(stdout, "ID\tKIND\tSTATE\tATTEMPT\tKEY\tNOTE\tLAST ERROR\tCREATED")
	for rows.Next() {
		var id int64
		var k, st, key, note, lastErr string
		var attempt, maxAttempts int
		var created time.Time
		if err := rows.Scan(&id, &k, &st, &attempt, &maxAttempts, &key, &note, &lastErr, &created); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", id, k, st, attempt, maxAttempts, key, dash(plain(note)), dash(plain(lastErr)), created.UTC().Format(time.RFC3339))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return tw.Flush()
}

func runJobsRetry(ctx context.Context, domains []*onceflow.Domain, args []string, getenv func(string) string, stdout io.Writer) error {
	c, fs, err := parse("jobs retry", domains, args, getenv, stdout, nil)
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("usage: onceflow jobs retry JOB-ID... (the ids onceflow jobs list -state discarded shows)")
	}
	var ids []int64
	for _, a := range fs.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("job id %q: want a positive number (onceflow jobs list)", a)
		}
		ids = append(ids, id)
	}
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var errs []error
	n := 0
	for _, id := range ids {
		if err := jobs.Retry(ctx, pool, id); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	fmt.Fprintf(stdout, "retrying %d jobs (same keys as before)\n", n)
	return errors.Join(errs...)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	if r := []rune(s); len(r) > 80 {
		return string(r[:77]) + "..."
	}
	return s
}
