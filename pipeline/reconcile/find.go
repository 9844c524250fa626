package reconcile

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline"
)

// maxPerKind bounds the findings of one kind in one run: a run over a
// pipeline that has been down for a day reports the oldest and leaves the
// rest to the next run.
const maxPerKind = 1000

const (
	// findPendingSQL: commands pending past the age, other than inbound
	// events' (those are inbound findings), those corrected, and those a
	// decision sent (a cause: a transfer's credit, a refund): those have
	// no key and no request to send again; they were committed to their
	// commands topic with their cause's decision, and a processor that
	// does not decide them shows in its lag.
	findPendingSQL = `SELECT c.command_id::text, c.tenant, c.aggregate_id, c.command_type, c.created_at,
			EXISTS (SELECT 1 FROM outbox AS o WHERE o.headers->>'command-id' = c.command_id::text)
		FROM command_status AS c
		WHERE c.status = 'pending' AND c.created_at < now() - make_interval(secs => $1) AND c.cause_command_id IS NULL
			AND NOT EXISTS (SELECT 1 FROM inbound_events AS e WHERE e.command_id = c.command_id)
			AND NOT EXISTS (SELECT 1 FROM reconcile_corrections AS r WHERE r.kind = 'pending' AND r.subject = c.command_id::text)
		ORDER BY c.created_at
		LIMIT $2`

	findDeadSQL = `SELECT d.id, d.topic, d.key, d.value, d.headers, d.created_at, d.reason, d.detail
		FROM outbox_dead AS d
		WHERE NOT EXISTS (SELECT 1 FROM reconcile_corrections AS r WHERE r.kind = 'outbox-dead' AND r.subject = d.id::text)
		ORDER BY d.id
		LIMIT $1`

	// findInboundSQL: provider events that made a command which did not
	// apply: failed, rejected, missing, or pending past the age.
	findInboundSQL = `SELECT e.provider, e.event_id, e.tenant, e.aggregate_id, e.command_id::text, coalesce(e.command_type, ''),
			e.received_at, coalesce(c.status, 'missing'), coalesce(c.reason, '')
		FROM inbound_events AS e
		LEFT JOIN command_status AS c ON c.command_id = e.command_id AND c.tenant = e.tenant AND c.aggregate_id = e.aggregate_id
		WHERE e.status = 'enqueued'
			AND (c.status IS NULL OR c.status IN ('failed', 'rejected')
				OR c.status = 'pending' AND c.created_at < now() - make_interval(secs => $1))
			AND NOT EXISTS (SELECT 1 FROM reconcile_corrections AS r
				WHERE r.kind = 'inbound' AND r.subject = e.provider || '/' || e.event_id)
		ORDER BY e.received_at
		LIMIT $2`

	// findJobsSQL: River jobs whose attempts ran out. A job is discarded
	// only after retryable failures (no answer, a timeout, a 5xx, a 429; a
	// permanent refusal cancels it), so each may have had its effect: its
	// call went out and the answer was lost. A webhook delivery's job
	// names its tenant, event and so its aggregate and command.
	findJobsSQL = `SELECT j.id, j.kind, coalesce(j.args->>'key', ''), coalesce(d.tenant, j.args->>'tenant', ''),
			coalesce(a.aggregate_id, ''), coalesce(a.command_id::text, ''), j.attempt,
			coalesce(j.finalized_at, j.created_at), coalesce(j.errors[array_length(j.errors, 1)]->>'error', '')
		FROM river_job AS j
		LEFT JOIN webhook_deliveries AS d ON d.job_id = j.id
		LEFT JOIN audit_log AS a ON a.event_id = d.event_id
		WHERE j.state = 'discarded'
			AND NOT EXISTS (SELECT 1 FROM reconcile_corrections AS r WHERE r.kind = 'job' AND r.subject = j.id::text)
		ORDER BY j.id
		LIMIT $1`

	// dlqStateSQL: of the commands of DLQ records, those with an outcome
	// that settles them (accepted or rejected: a redrive worked) and the
	// records already corrected, and the commands' Idempotency-Keys.
	dlqStateSQL = `SELECT 'settled', c.command_id::text || ' ' || c.aggregate_id FROM command_status AS c
			WHERE c.command_id = ANY($1::uuid[]) AND c.status IN ('accepted', 'rejected')
		UNION ALL
		SELECT 'corrected', r.subject FROM reconcile_corrections AS r WHERE r.kind = 'dlq' AND r.subject = ANY($2)
`

	// keysSQL: the Idempotency-Keys of commands, in one statement for a
	// run's findings (idempotency_keys has no index by command id).
	keysSQL = `SELECT command_id::text, tenant, key FROM idempotency_keys WHERE command_id = ANY($1::uuid[])`
)

// find runs every kind's query.
func (r *Reconciler) find(ctx context.Context) ([]Finding, error) {
	var out []Finding
	for _, fn := range []func(context.Context) ([]Finding, error){r.findPending, r.findDead, r.findDLQ, r.findInbound, r.findJobs} {
		fs, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, fs...)
	}
	if err := r.keys(ctx, out); err != nil {
		return nil, err
	}
	sortFindings(out)
	return out, nil
}

// keys sets the Idempotency-Key of the findings of commands ingest
// accepted over HTTP (pending, outbox-dead, dlq), while the key is kept.
func (r *Reconciler) keys(ctx context.Context, fs []Finding) error {
	var ids []string
	for _, f := range fs {
		if f.Key == "" && f.Kind != KindInbound && f.Kind != KindJob {
			if _, err := pipeline.ParseID(f.CommandID); err == nil {
				ids = append(ids, f.CommandID)
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := r.pool.Query(ctx, keysSQL, ids)
	if err != nil {
		return fmt.Errorf("read the findings' Idempotency-Keys: %w", err)
	}
	defer rows.Close()
	keys := map[[2]string]string{}
	for rows.Next() {
		var id, tenant, key string
		if err := rows.Scan(&id, &tenant, &key); err != nil {
			return err
		}
		keys[[2]string{id, tenant}] = key
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i := range fs {
		if fs[i].Key == "" && fs[i].Kind != KindInbound && fs[i].Kind != KindJob {
			fs[i].Key = keys[[2]string{fs[i].CommandID, fs[i].Tenant}]
		}
	}
	return nil
}

func (r *Reconciler) findPending(ctx context.Context) ([]Finding, error) {
	return r.findRows(ctx, "find pending commands", func(row pgx.CollectableRow) (Finding, error) {
		f := Finding{Kind: KindPending}
		var inOutbox bool
		if err := row.Scan(&f.CommandID, &f.Tenant, &f.AggregateID, &f.CommandType, &f.Since, &inOutbox); err != nil {
			return f, err
		}
		f.Subject = f.CommandID
		f.Detail = fmt.Sprintf("pending for %s; shipped: no outcome from the processor and projector yet", age(f.Since))
		if inOutbox {
			f.Detail = fmt.Sprintf("pending for %s, still in the outbox: no relay has shipped it", age(f.Since))
		}
		return f, nil
	}, findPendingSQL, r.cfg.MaxPendingAge.Seconds(), maxPerKind)
}

func (r *Reconciler) findDead(ctx context.Context) ([]Finding, error) {
	return r.findRows(ctx, "find outbox_dead rows", func(row pgx.CollectableRow) (Finding, error) {
		var id int64
		rec := &record{}
		var reason, detail string
		f := Finding{Kind: KindOutboxDead}
		if err := row.Scan(&id, &rec.topic, &rec.key, &rec.value, &rec.headers, &f.Since, &reason, &detail); err != nil {
			return f, err
		}
		rec.deadID = &id
		f.Subject = fmt.Sprint(id)
		f.AggregateID = string(rec.key)
		f.Tenant = rec.headers[pipeline.HeaderTenant]
		f.CommandID = rec.headers[pipeline.HeaderCommandID]
		f.CommandType = rec.headers[pipeline.HeaderCommandType]
		f.Detail = "the broker refused it for good: " + reason
		f.record = rec
		return f, nil
	}, findDeadSQL, maxPerKind)
}

func (r *Reconciler) findInbound(ctx context.Context) ([]Finding, error) {
	return r.findRows(ctx, "find unapplied inbound events", func(row pgx.CollectableRow) (Finding, error) {
		f := Finding{Kind: KindInbound}
		var provider, eventID, status, reason string
		if err := row.Scan(&provider, &eventID, &f.Tenant, &f.AggregateID, &f.CommandID, &f.CommandType, &f.Since, &status, &reason); err != nil {
			return f, err
		}
		f.Subject = provider + "/" + eventID
		f.Key = f.Subject
		f.Detail = "its command is " + status
		if reason != "" {
			f.Detail += " (" + reason + ")"
		}
		return f, nil
	}, findInboundSQL, r.cfg.MaxPendingAge.Seconds(), maxPerKind)
}

func (r *Reconciler) findDLQ(ctx context.Context) ([]Finding, error) {
	if r.cfg.DeadLetters == nil {
		return nil, nil
	}
	dls, err := r.cfg.DeadLetters(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the DLQ: %w", err)
	}
	var ids, subjects []string
	for _, d := range dls {
		if _, err := pipeline.ParseID(d.Header(pipeline.HeaderCommandID)); err == nil {
			ids = append(ids, d.Header(pipeline.HeaderCommandID))
		}
		subjects = append(subjects, dlqSubject(d))
	}
	if len(dls) == 0 {
		return nil, nil
	}
	settled, corrected := map[string]bool{}, map[string]bool{}
	rows, err := r.pool.Query(ctx, dlqStateSQL, ids, subjects)
	if err != nil {
		return nil, fmt.Errorf("read the DLQ commands' outcomes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var what, v string
		if err := rows.Scan(&what, &v); err != nil {
			return nil, err
		}
		if what == "settled" {
			settled[v] = true
		} else {
			corrected[v] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []Finding
	for _, d := range dls {
		id := d.Header(pipeline.HeaderCommandID)
		if settled[id+" "+string(d.Key)] || corrected[dlqSubject(d)] {
			continue
		}
		f := Finding{
			Kind: KindDLQ, Subject: dlqSubject(d), Tenant: d.Header(pipeline.HeaderTenant), AggregateID: string(d.Key),
			CommandID: id, CommandType: d.Header(pipeline.HeaderCommandType), Since: d.Time,
			Detail: "in the DLQ: " + d.Reason,
		}
		if len(d.Omitted) == 0 {
			h := map[string]string{}
			for _, x := range d.Headers {
				h[x.Key] = string(x.Value)
			}
			f.record = &record{topic: d.CommandsTopic, key: d.Key, value: d.Value, headers: h}
		} else {
			f.Detail += "; the DLQ copy left out " + strings.Join(d.Omitted, ", ")
		}
		out = append(out, f)
		if len(out) == maxPerKind {
			break
		}
	}
	return out, nil
}

func dlqSubject(d DeadLetter) string { return fmt.Sprintf("%s/%d:%d", d.Topic, d.Partition, d.Offset) }

func age(t time.Time) string { return time.Since(t).Round(time.Second).String() }

func (r *Reconciler) findJobs(ctx context.Context) ([]Finding, error) {
	return r.findRows(ctx, "find discarded jobs", func(row pgx.CollectableRow) (Finding, error) {
		f := Finding{Kind: KindJob}
		var id int64
		var kind, lastErr string
		var attempts int
		if err := row.Scan(&id, &kind, &f.Key, &f.Tenant, &f.AggregateID, &f.CommandID, &attempts, &f.Since, &lastErr); err != nil {
			return f, err
		}
		f.jobID = &id
		f.Subject = fmt.Sprint(id)
		f.CommandType = kind
		f.Detail = fmt.Sprintf("%s job out of attempts (%d), the last: %s; its call may have been applied", kind, attempts, lastErr)
		return f, nil
	}, findJobsSQL, maxPerKind)
}

// findRows runs a kind's query and makes a finding of each row with scan;
// what names the query in its error.
func (r *Reconciler) findRows(ctx context.Context, what string, scan pgx.RowToFunc[Finding], query string, args ...any) ([]Finding, error) {
	rows, err := r.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return pgx.CollectRows(rows, scan)
}
