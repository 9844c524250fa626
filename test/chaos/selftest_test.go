package chaos

import (
	"context"
	"strings"
	"testing"
)

// checkerSelfTest corrupts the drained pipeline's read models the ways a
// real bug would — a double-applied amount, a lost outcome, a projection
// that skipped an event — and asserts the checker reports each one, then
// puts everything back. A checker that cannot fail proves nothing.
func checkerSelfTest(t *testing.T, ctx context.Context, c *cluster, m *model) {
	t.Helper()
	expect := func(what, property string, corrupt, restore string, args ...any) {
		t.Helper()
		if _, err := c.pool.Exec(ctx, corrupt, args...); err != nil {
			t.Fatalf("self-test %s: corrupt: %v", what, err)
		}
		vs, _ := check(ctx, c, m)
		if _, err := c.pool.Exec(ctx, restore, args...); err != nil {
			t.Fatalf("self-test %s: restore: %v", what, err)
		}
		for _, v := range vs {
			if strings.Contains(v.property, property) {
				return
			}
		}
		t.Errorf("self-test %s: the checker did not report %q (got %v)", what, property, vs)
	}
	var tenant, account, cmdID string
	err := c.pool.QueryRow(ctx, `SELECT a.tenant, a.account_id, s.command_id::text
		FROM accounts a JOIN command_status s ON s.aggregate_id = a.tenant || '/' || a.account_id
		WHERE s.status = 'accepted' AND s.command_type = 'Deposit' LIMIT 1`).Scan(&tenant, &account, &cmdID)
	if err != nil {
		t.Fatalf("self-test: find a deposit: %v", err)
	}
	expect("double effect", "every balance equals the accepted commands",
		`UPDATE accounts SET balance = balance + 7 WHERE tenant = $1 AND account_id = $2`,
		`UPDATE accounts SET balance = balance - 7 WHERE tenant = $1 AND account_id = $2`, tenant, account)
	expect("lost outcome", "every accepted command has exactly one outcome",
		`UPDATE command_status SET status = 'pending' WHERE command_id = $1::uuid`,
		`UPDATE command_status SET status = 'accepted' WHERE command_id = $1::uuid`, cmdID)
	expect("skipped event", "every read model is at its aggregate's last version",
		`UPDATE accounts SET version = version - 1 WHERE tenant = $1 AND account_id = $2`,
		`UPDATE accounts SET version = version + 1 WHERE tenant = $1 AND account_id = $2`, tenant, account)
}
