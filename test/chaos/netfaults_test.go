package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/test/kafkacluster"
)

// The network's faults (-chaos.kafka), every process alive meanwhile
// (docs/chaos.md#network-faults).
const (
	faultPartitionCoordinator = "partition: a processor's or the relays' connections to its transaction coordinator"
	faultPartitionNode        = "partition: one node isolated from the other two and the clients"
	faultPartitionAsymmetric  = "partition: one node deaf or mute"
	faultSlowLink             = "slow link: one node's packets through a narrow queue"
	faultPostgresCut          = "postgres connections cut after COMMIT or mid-transaction"
)

// isNetFault reports whether kind is one of the network's faults.
func isNetFault(kind string) bool {
	switch kind {
	case faultPartitionCoordinator, faultPartitionNode, faultPartitionAsymmetric, faultSlowLink, faultPostgresCut:
		return true
	}
	return false
}

// pgCutKinds are the components whose connections to Postgres go through
// a pgCut proxy on a run with the postgres-cut fault.
var pgCutKinds = []string{"ingest", "relay", "projector"}

// nodePorts are the ports of node n's listeners: its broker's (clients and
// the other nodes' replicas) and its controller's (the quorum's votes).
func nodePorts(n *kafkacluster.Node) []int { return []int{portOf(n.Addr), portOf(n.ControllerAddr)} }

// injectNet injects one of the network's faults, heals it after a bounded
// time and, for the nodes' faults, waits until every partition is in sync
// again.
func (f *faults) injectNet(ctx context.Context, kind string, pick int) {
	nm := f.c.net
	start := time.Now()
	var detail string
	var err error
	switch kind {
	case faultPartitionCoordinator:
		detail, err = f.partitionCoordinator(ctx, pick)
	case faultPartitionNode:
		n := f.c.kafka.Nodes()[pick%3]
		hold := brokerSessionTimeout + time.Duration(3+pick%6)*time.Second
		if err = nm.cut(dropFrom(nm.path("kafka", fmt.Sprintf("node-%d", n.ID))), dropTo(nodePorts(n)...)); err == nil {
			waitCtx(ctx, hold)
			nm.heal()
			detail = fmt.Sprintf("node %d: nothing it sends leaves, nothing reaches its ports %v, for %s", n.ID, nodePorts(n), hold)
		}
	case faultPartitionAsymmetric:
		n := f.c.kafka.Nodes()[pick%3]
		hold := brokerSessionTimeout + time.Duration(3+pick%6)*time.Second
		variant := []string{"deaf", "mute"}[(pick/3)%2]
		if variant == "deaf" {
			// Deaf: its own connections out (to the active controller, to
			// the leaders it follows) work; nothing reaches its listeners.
			err = nm.cut(dropTo(nodePorts(n)...))
			detail = fmt.Sprintf("node %d deaf: nothing reaches its ports %v, its own connections out work, for %s", n.ID, nodePorts(n), hold)
		} else {
			// Mute: it hears everything and nothing it sends leaves.
			err = nm.cut(dropFrom(nm.path("kafka", fmt.Sprintf("node-%d", n.ID))))
			detail = fmt.Sprintf("node %d mute: what is sent to it arrives, nothing it sends leaves, for %s", n.ID, hold)
		}
		if err == nil {
			f.noteState(kind, variant)
			waitCtx(ctx, hold)
			nm.heal()
		}
	case faultSlowLink:
		n := f.c.kafka.Nodes()[pick%3]
		hold := time.Duration(20+pick%20) * time.Second
		if err = nm.slow(markFrom(nm.path("kafka", fmt.Sprintf("node-%d", n.ID))), markTo(nodePorts(n)...)); err == nil {
			waitCtx(ctx, hold)
			nm.heal()
			detail = fmt.Sprintf("node %d: what it sends and what reaches its ports %v through %s, for %s", n.ID, nodePorts(n), slowLink, hold)
		}
	case faultPostgresCut:
		detail = f.postgresCut(ctx, pick)
	}
	if err == nil && kind != faultPostgresCut {
		err = f.c.kafka.WaitInSync(ctx)
	}
	if err != nil {
		nm.heal()
		f.fail(fmt.Errorf("%s: %w", kind, err))
		return
	}
	f.note(kind, fmt.Sprintf("%s; healed, in sync again after %s", detail, time.Since(start).Round(time.Millisecond)), start)
}

// partitionCoordinator cuts one processor's connections (pick even), or
// every relay's (pick odd), to the node that coordinates its transactional
// id, once the coordinator describes its transaction as open (Ongoing:
// between its first AddPartitions and its EndTxn) or committing, and heals
// the cut after 5 to 15 s.
func (f *faults) partitionCoordinator(ctx context.Context, pick int) (string, error) {
	nm, kc := f.c.net, f.c.kafka
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers()...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var txnID string
	var who []string
	if pick%2 == 0 {
		processor := fmt.Sprintf("processor-%d", 1+(pick/2)%2)
		txnID, err = transactionalID(ctx, adm, processor)
		who = []string{processor}
	} else {
		txnID, err = relayTransactionalID(ctx, adm, pick/2)
		who = []string{"relay-1", "relay-2", "relay-extra"}
	}
	if err != nil {
		return "", err
	}
	n, err := kc.TxnCoordinator(ctx, txnID)
	if err != nil {
		return "", err
	}
	state, took := huntState(ctx, adm, txnID, "Ongoing")
	var rules []rule
	for _, name := range who {
		// relay-extra's cgroup is made when the relay fault first starts it.
		if _, err := os.Stat(filepath.Join(nm.cgroups("components"), name)); err == nil {
			rules = append(rules, dropFromTo(nm.path("components", name), portOf(n.Addr)))
		}
	}
	if err := nm.cut(rules...); err != nil {
		return "", err
	}
	f.noteState(faultPartitionCoordinator, state)
	hold := time.Duration(5+pick%11) * time.Second
	waitCtx(ctx, hold)
	nm.heal()
	return fmt.Sprintf("%s cut from node %d (%s), coordinator of %s, at %s (seen after %s), for %s",
		strings.Join(who[:min(len(who), 2)], " and "), n.ID, n.Addr, txnID, state, took.Round(time.Millisecond), hold), nil
}

// relayTransactionalID returns one of the relays' transactional ids the
// coordinators know, the pick-th of them.
func relayTransactionalID(ctx context.Context, adm *kadm.Client, pick int) (string, error) {
	txs, err := adm.ListTransactions(ctx, nil, nil)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, id := range txs.TransactionalIDs() {
		if strings.Contains(id, "relay") {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("no relay's transactional id among the coordinators' transactions")
	}
	return ids[pick%len(ids)], nil
}

// postgresCut arms the proxy of one kind's connections (ingest, relay,
// projector) for up to three cuts of one mode within 10 s, then disarms
// it.
func (f *faults) postgresCut(ctx context.Context, pick int) string {
	kind := pgCutKinds[pick%len(pgCutKinds)]
	mode := []string{cutCommit, cutMidTx}[(pick/3)%2]
	p := f.c.pgCut[kind]
	const cuts = 3
	p.arm(mode, cuts)
	waitCtx(ctx, 10*time.Second)
	made := cuts - p.arm("", 0)
	if made > 0 {
		f.noteState(faultPostgresCut, fmt.Sprintf("%s %s", kind, mode))
	} else {
		f.noteState(faultPostgresCut, fmt.Sprintf("%s: no connection passed a point to cut", kind))
	}
	return fmt.Sprintf("%s's connections cut %s: %d of up to %d within 10 s", kind, mode, made, cuts)
}
