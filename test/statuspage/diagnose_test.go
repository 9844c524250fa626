package statuspage

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// diagnose writes, for a failed test, where the pipeline stands while it
// still runs: the goroutines of onceflow and franz-go (a stage blocked
// on something shows there), the log's last lines, then, last so it is
// the part of a long output that is read, each stage's backlog — rows still in the outbox,
// the commands and events topics' ends (read_committed and not, so a
// transaction left open shows as a gap), the groups' committed offsets,
// the projector's offsets in Postgres, and command_status by status.
func (s *devStack) diagnose(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var b strings.Builder

	var dump bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&dump, 1); err == nil {
		b.WriteString("goroutines of onceflow and franz-go (count @ stack):\n")
		for _, g := range strings.Split(dump.String(), "\n\n") {
			if strings.Contains(g, "onceflow/") || strings.Contains(g, "franz-go/pkg/kgo") {
				b.WriteString(g)
				b.WriteString("\n\n")
			}
		}
	}

	fmt.Fprintf(&b, "the log's last lines:\n%s\n", tail(s.logs, 60))
	b.WriteString("where the pipeline stands:\n")
	row := func(label, sql string, args ...any) {
		rows, err := s.pool.Query(ctx, sql, args...)
		if err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", label, err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, "  %s: %v\n", label, err)
				return
			}
			fmt.Fprintf(&b, "  %s: %v\n", label, vals)
		}
	}
	row("outbox (rows, oldest)", `SELECT count(*), min(created_at) FROM outbox`)
	row("outbox_dead (rows)", `SELECT count(*) FROM outbox_dead`)
	row("command_status (status, rows)", `SELECT status, count(*) FROM command_status GROUP BY status ORDER BY status`)
	row("projector offsets (consumer, topic, partition, next)", `SELECT consumer, topic, partition, next_offset FROM consumer_offsets ORDER BY 1, 2, 3`)

	cl, err := kgo.NewClient(kgo.SeedBrokers(s.addrs.Kafka))
	if err != nil {
		fmt.Fprintf(&b, "  kafka: %v\n", err)
		t.Log(b.String())
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics := []string{"ledger.commands", events}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	stable, err2 := adm.ListCommittedOffsets(ctx, topics...) // read_committed: the last stable offsets
	if err != nil || err2 != nil {
		fmt.Fprintf(&b, "  kafka offsets: %v %v\n", err, err2)
	} else {
		var lines []string
		ends.Each(func(o kadm.ListedOffset) {
			lso, _ := stable.Lookup(o.Topic, o.Partition)
			lines = append(lines, fmt.Sprintf("  %s/%d: end %d, last stable %d\n", o.Topic, o.Partition, o.Offset, lso.Offset))
		})
		sort.Strings(lines)
		b.WriteString(strings.Join(lines, ""))
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		fmt.Fprintf(&b, "  groups: %v\n", err)
	}
	names := groups.Groups()
	sort.Strings(names)
	for _, g := range names {
		offs, err := adm.FetchOffsets(ctx, g)
		if err != nil {
			fmt.Fprintf(&b, "  group %s: %v\n", g, err)
			continue
		}
		offs.Each(func(o kadm.OffsetResponse) {
			fmt.Fprintf(&b, "  group %s %s/%d: committed %d\n", g, o.Topic, o.Partition, o.At)
		})
	}
	t.Log(b.String())
}
