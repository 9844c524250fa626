package chaos

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// The postgres-cut fault's proxy cuts a pgx connection right after its
// COMMIT went out: the client gets an error and the row is stored; cut in
// the middle of a transaction, after a batch, the client gets an error and
// nothing is stored. Disarmed, it passes everything.
func TestPostgresCut(t *testing.T) {
	ctx := context.Background()
	direct := pipelinetest.DatabaseURL(t)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPGCut(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	u.Host = p.Addr()
	proxied := u.String()
	admin, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE TABLE cut (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	write := func(id int) error {
		conn, err := pgx.Connect(ctx, proxied)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO cut VALUES ($1)`, id)
		b.Queue(`SELECT 1`)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	// stored answers once the server has ended every other session of the
	// database: a cut client learns of the cut before the server has run
	// what it was sent.
	stored := func(id int) bool {
		pipelinetest.Eventually(t, 30*time.Second, func() error {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%d other sessions", n)
			}
			return nil
		})
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM cut WHERE id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	if err := write(1); err != nil || !stored(1) {
		t.Fatalf("disarmed: %v, stored %v", err, stored(1))
	}
	p.arm(cutCommit, 1)
	if err := write(2); err == nil {
		t.Errorf("cut after COMMIT: the client's commit returned no error")
	}
	if !stored(2) {
		t.Errorf("cut after COMMIT: the row is not stored, want the server to have committed it")
	}
	p.arm(cutMidTx, 1)
	if err := write(3); err == nil {
		t.Errorf("cut mid-transaction: no error")
	}
	if stored(3) {
		t.Errorf("cut mid-transaction: the row is stored")
	}
	// A batch that writes outside a transaction commits at its Sync.
	p.arm(cutCommit, 1)
	conn, err := pgx.Connect(ctx, proxied)
	if err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO cut VALUES (5)`)
	b.Queue(`SELECT 1`)
	if err := conn.SendBatch(ctx, b).Close(); err == nil {
		t.Errorf("cut after an implicit transaction's Sync: no error")
	}
	conn.Close(ctx)
	if !stored(5) {
		t.Errorf("cut after an implicit transaction's Sync: the row is not stored")
	}
	if left := p.arm("", 0); left != 0 {
		t.Errorf("%d cuts left unmade", left)
	}
	if err := write(4); err != nil || !stored(4) {
		t.Fatalf("disarmed again: %v, stored %v", err, stored(4))
	}
}
