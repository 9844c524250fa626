package chaos

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline"
)

// checkerSelfTest corrupts the drained pipeline's read models the ways a
// real bug would — a double-applied amount, a lost outcome, a projection
// that skipped an event, a hostile record's failure lost — and asserts the
// checker reports each one, then puts everything back; then it feeds the
// checker the topics as a broken processor would have left them — a
// hostile record twice in the DLQ, or missing, or with another reason, a
// good command in the DLQ, a CommandFailed missing. A checker that cannot
// fail proves nothing.
func checkerSelfTest(t *testing.T, ctx context.Context, c *cluster, m *model, decode decodeFunc) {
	t.Helper()
	reported := func(vs []violation, property string) bool {
		for _, v := range vs {
			if strings.Contains(v.property, property) {
				return true
			}
		}
		return false
	}
	expect := func(what, property string, corrupt, restore string, args ...any) {
		t.Helper()
		if _, err := c.pool.Exec(ctx, corrupt, args...); err != nil {
			t.Fatalf("self-test %s: corrupt: %v", what, err)
		}
		vs, _ := check(ctx, c, m, decode)
		if _, err := c.pool.Exec(ctx, restore, args...); err != nil {
			t.Fatalf("self-test %s: restore: %v", what, err)
		}
		if !reported(vs, property) {
			t.Errorf("self-test %s: the checker did not report %q (got %v)", what, property, vs)
		}
	}
	var tenant, account, cmdID string
	err := c.pool.QueryRow(ctx, `SELECT a.tenant, a.account_id, s.command_id::text
		FROM accounts a JOIN command_status s ON s.aggregate_id = a.tenant || '/' || a.account_id
		WHERE s.status = 'accepted' AND s.command_type = 'Deposit' LIMIT 1`).Scan(&tenant, &account, &cmdID)
	if err != nil {
		t.Fatalf("self-test: find a deposit: %v", err)
	}
	agg := pipeline.AggregateID(tenant, account)
	expect("double effect", "every balance equals the accepted commands",
		`UPDATE accounts SET balance = balance + 7 WHERE tenant = $1 AND account_id = $2`,
		`UPDATE accounts SET balance = balance - 7 WHERE tenant = $1 AND account_id = $2`, tenant, account)
	expect("lost outcome", "every accepted command has exactly one outcome",
		`UPDATE command_status SET status = 'pending' WHERE command_id = $1::uuid AND aggregate_id = $2`,
		`UPDATE command_status SET status = 'accepted' WHERE command_id = $1::uuid AND aggregate_id = $2`, cmdID, agg)
	expect("skipped event", "every read model is at its aggregate's last version",
		`UPDATE accounts SET version = version - 1 WHERE tenant = $1 AND account_id = $2`,
		`UPDATE accounts SET version = version + 1 WHERE tenant = $1 AND account_id = $2`, tenant, account)
	var failed *hostileRecord
	for _, h := range m.hostile {
		if h.kind.onAggregate && h.acked {
			failed = h
			break
		}
	}
	if failed == nil {
		t.Fatal("self-test: no hostile record naming a valid aggregate was taken by the broker")
	}
	expect("hostile failure lost", "shows failed with its reason in command_status",
		`UPDATE command_status SET status = 'accepted' WHERE command_id = $1::uuid AND aggregate_id = $2`,
		`UPDATE command_status SET status = 'failed' WHERE command_id = $1::uuid AND aggregate_id = $2`, failed.commandID, failed.aggregate)

	o, err := observe(ctx, c)
	if err != nil {
		t.Fatalf("self-test: %v", err)
	}
	if vs, _ := verify(ctx, m, o, decode); len(vs) > 0 {
		t.Fatalf("self-test: the pipeline as it is violates %v", vs)
	}
	dlq := o.dlq
	if len(dlq) == 0 {
		t.Fatal("self-test: the DLQ is empty")
	}
	failure := slices.IndexFunc(o.events, func(r *kgo.Record) bool { return header(r, pipeline.HeaderEventType) == "CommandFailed" })
	if failure < 0 {
		t.Fatal("self-test: the events topic holds no CommandFailed")
	}
	withReason := func(r *kgo.Record, reason string) *kgo.Record {
		c := *r
		c.Headers = slices.Clone(r.Headers)
		for i := range c.Headers {
			if c.Headers[i].Key == pipeline.HeaderDLQReason {
				c.Headers[i].Value = []byte(reason)
			}
		}
		return &c
	}
	var good *kgo.Record // a good command's record as the DLQ would hold it
	for _, r := range o.commands {
		if _, hostile := hostileNumber(r); !hostile {
			c := *r
			good = &c
			good.Headers = append(slices.Clone(r.Headers),
				kgo.RecordHeader{Key: pipeline.HeaderDLQReason, Value: []byte("decider-error")},
				kgo.RecordHeader{Key: pipeline.HeaderDLQSourceTopic, Value: []byte(o.commandsTopic)},
				kgo.RecordHeader{Key: pipeline.HeaderDLQSourcePartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
				kgo.RecordHeader{Key: pipeline.HeaderDLQSourceOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))})
			break
		}
	}
	for _, tc := range []struct {
		what, property string
		tamper         func(o *observation)
	}{
		{"a DLQ record twice", "in the DLQ exactly once", func(o *observation) { o.dlq = append(slices.Clone(dlq), dlq[0]) }},
		{"a DLQ record missing", "in the DLQ exactly once", func(o *observation) { o.dlq = slices.Clone(dlq[1:]) }},
		{"another DLQ reason", "has its expected reason", func(o *observation) {
			o.dlq = slices.Clone(dlq)
			o.dlq[0] = withReason(dlq[0], "decider-panic")
		}},
		{"a good command in the DLQ", "the DLQ holds only hostile records", func(o *observation) { o.dlq = append(slices.Clone(dlq), good) }},
		{"a CommandFailed missing", "recorded there as CommandFailed", func(o *observation) {
			o.events = slices.Delete(slices.Clone(o.events), failure, failure+1)
		}},
	} {
		bad := *o
		tc.tamper(&bad)
		if vs, _ := verify(ctx, m, &bad, decode); !reported(vs, tc.property) {
			t.Errorf("self-test %s: the checker did not report %q (got %v)", tc.what, tc.property, vs)
		}
	}
}
