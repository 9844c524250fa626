package cli_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/pipelinetest"
)

// foreignGroup makes a consumer group that is none of onceflow's: a plain
// client reads a topic of its own (ten records, five seconds apart, the
// first 100 s old), commits offset 6 and stays in the group. It returns
// when the record at offset 6 was written.
func foreignGroup(t *testing.T, brokers []string, group, topic string) time.Time {
	t.Helper()
	ctx := context.Background()
	if _, err := kadm.NewClient(pipelinetest.Client(t, brokers)).CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-100 * time.Second)
	prod := pipelinetest.Client(t, brokers, kgo.DefaultProduceTopic(topic))
	for i := 0; i < 10; i++ {
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("o"), Timestamp: base.Add(time.Duration(i) * 5 * time.Second)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	consumer := pipelinetest.Client(t, brokers, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.ClientID(group+"-client"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	pollCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []*kgo.Record
	for len(got) < 10 {
		fs := consumer.PollFetches(pollCtx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		got = append(got, fs.Records()...)
	}
	if err := consumer.CommitRecords(ctx, got[5]); err != nil {
		t.Fatal(err)
	}
	return base.Add(30 * time.Second)
}

// `onceflow lag` shows every consumer group of the cluster, not only
// onceflow's: a foreign group's lag in records and seconds, and its member.
func TestLagShowsForeignGroups(t *testing.T) {
	t.Parallel()
	c := newProjCLI(t)
	oldest := foreignGroup(t, c.brokers, "billing", "orders")

	out, err := c.run("lag", "-wide") // with the member's client id
	if err != nil {
		t.Fatalf("lag: %v\n%s", err, out)
	}
	if !strings.Contains(out, "billing") || !strings.Contains(out, "billing-client") {
		t.Errorf("onceflow lag does not show the group billing and its member:\n%s", out)
	}

	out, err = c.run("lag", "-o", "json", "-group", "billing")
	if err != nil {
		t.Fatalf("lag -o json: %v\n%s", err, out)
	}
	var doc struct {
		Partitions []struct {
			Group      string  `json:"group"`
			Topic      string  `json:"topic"`
			Current    int64   `json:"current_offset"`
			In         string  `json:"offsets_in"`
			Lag        int64   `json:"lag"`
			LagSeconds float64 `json:"lag_seconds"`
			ConsumerID string  `json:"consumer_id"`
			ClientID   string  `json:"client_id"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(doc.Partitions) != 1 {
		t.Fatalf("got %d rows, want 1: %s", len(doc.Partitions), out)
	}
	p := doc.Partitions[0]
	wantAge := time.Since(oldest).Seconds()
	if p.Topic != "orders" || p.Current != 6 || p.In != "kafka" || p.Lag != 4 || math.Abs(p.LagSeconds-wantAge) > 3 ||
		p.ClientID != "billing-client" || p.ConsumerID == "" {
		t.Errorf("got %+v, want orders at 6 in kafka, lag 4 and %.0f s, the member billing-client", p, wantAge)
	}
}

// `onceflow lag -serve` exports every consumer's lag with Kafka Lag
// Exporter's names, a foreign group included.
func TestLagServe(t *testing.T) {
	t.Parallel()
	c := newProjCLI(t)
	oldest := foreignGroup(t, c.brokers, "billing", "orders")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"lag", "-serve", addr}, func(k string) string { return c.env[k] }, &strings.Builder{})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("lag -serve: %v", err)
		}
	}()

	var lag, seconds float64
	pipelinetest.Eventually(t, 20*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		lag, seconds = -1, -1
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `group="billing"`) || !strings.Contains(line, `client_id="billing-client"`) {
				continue
			}
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			switch {
			case strings.HasPrefix(line, "kafka_consumergroup_group_lag{"):
				lag = v
			case strings.HasPrefix(line, "kafka_consumergroup_group_lag_seconds{"):
				seconds = v
			}
		}
		if lag < 0 || seconds < 0 {
			return fmt.Errorf("no lag series of the group billing yet")
		}
		return nil
	})
	if want := time.Since(oldest).Seconds(); lag != 4 || math.Abs(seconds-want) > 3 {
		t.Errorf("billing: lag %v records, %.1f s; want 4 and %.0f", lag, seconds, want)
	}
}

// A group stopped at a batch that decompresses beyond the bound (a
// compressed bomb) shows it: batch-too-large@OFFSET in the PARKED column,
// and what to do below the table; neither the row's lag in seconds nor
// the probe decompresses it.
func TestLagShowsABlockedBatch(t *testing.T) {
	t.Parallel()
	c := newProjCLI(t)
	ctx := context.Background()
	const topic = "bombed"
	adm := kadm.NewClient(pipelinetest.Client(t, c.brokers))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	bomber := pipelinetest.Client(t, c.brokers, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(64<<20))
	if err := bomber.ProduceSync(ctx, &kgo.Record{Value: []byte("ok")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	bomb, err := bomber.ProduceSync(ctx, &kgo.Record{Value: make([]byte, 32<<20)}).First()
	if err != nil {
		t.Fatal(err)
	}
	offsets := kadm.Offsets{}
	offsets.AddOffset(topic, 0, bomb.Offset, -1)
	if _, err := adm.CommitOffsets(ctx, "stuck", offsets); err != nil {
		t.Fatal(err)
	}
	out, err := c.run("lag", "-group", "stuck")
	if err != nil {
		t.Fatalf("lag: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("batch-too-large@%d", bomb.Offset); !strings.Contains(out, want) || !strings.Contains(out, "KAFKA_MAX_DECOMPRESS_BATCH_BYTES") {
		t.Errorf("onceflow lag does not show %s and what to do:\n%s", want, out)
	}
}
