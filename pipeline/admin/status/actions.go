package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pipeline/admin"
	"github.com/onceflow/onceflow/pipeline/kafka"
	"github.com/onceflow/onceflow/pipeline/processor"
	"github.com/onceflow/onceflow/pipeline/projector"
)

// maxRecordsPerRedrive bounds the records one redrive by coordinates
// names; a reason redrives all of its records.
const maxRecordsPerRedrive = 100

type unparkRequest struct {
	Consumer  string `json:"consumer"`
	Topic     string `json:"topic"`
	Partition *int32 `json:"partition"`
}

// unpark removes one partition's parked row, as `onceflow projections
// unpark` does: the projector that owns it tries its record again.
func (p *Page) unpark(w http.ResponseWriter, r *http.Request) {
	var req unparkRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Consumer == "" || req.Topic == "" || req.Partition == nil || *req.Partition < 0 {
		fail(w, http.StatusBadRequest, "invalid-action", "name the consumer, topic and partition to unpark")
		return
	}
	if p.cfg.Pool == nil {
		fail(w, http.StatusConflict, "no-database", "this process has no database: unpark from a process that runs the projector, or with `onceflow projections unpark`")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	n, err := projector.Unpark(ctx, p.cfg.Pool, req.Consumer, req.Topic, []int32{*req.Partition})
	p.parked.forget()
	if err != nil {
		p.cfg.Logger.Error("status page: unpark", "consumer", req.Consumer, "topic", req.Topic, "partition", *req.Partition, "err", err)
		fail(w, http.StatusInternalServerError, "action-failed", "unpark failed; the process's log says why")
		return
	}
	if n == 0 {
		fail(w, http.StatusNotFound, "not-parked", "%s partition %d of %s is not parked", req.Consumer, *req.Partition, req.Topic)
		return
	}
	p.cfg.Logger.Info("status page: unparked", "consumer", req.Consumer, "topic", req.Topic, "partition", *req.Partition, "operator", admin.Identity(r))
	writeJSON(w, http.StatusOK, actionResult{Count: n, Message: fmt.Sprintf(
		"unparked %s partition %d of %s: its projector tries the record again within seconds (it parks again if the cause is still there)",
		req.Consumer, *req.Partition, req.Topic)})
}

type skipBatchRequest struct {
	Topic     string `json:"topic"`
	Partition *int32 `json:"partition"`
	Offset    *int64 `json:"offset"`
	Note      string `json:"note"`
	Operator  string `json:"operator"`
}

// skipBatch skips a batch too large to decompress that a processor of
// this process is blocked on, recorded in the DLQ (processor.SkipBatch).
func (p *Page) skipBatch(w http.ResponseWriter, r *http.Request) {
	var req skipBatchRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Topic == "" || req.Partition == nil || req.Offset == nil || req.Note == "" {
		fail(w, http.StatusBadRequest, "invalid-action", "name the topic, partition and offset of the blocked batch and why (note)")
		return
	}
	// Who skipped is who the token proves, not the name the body sends,
	// which is kept as its claim (admin.Who).
	who := admin.Who(r, req.Operator)
	if p.cfg.SkipBatch == nil {
		fail(w, http.StatusConflict, "no-processor", "this process runs no processor: skip from the process whose processor is blocked (its page marks the partition)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	to, err := p.cfg.SkipBatch(ctx, req.Topic, *req.Partition, *req.Offset, req.Note, who)
	switch {
	case errors.Is(err, processor.ErrNotBlocked):
		fail(w, http.StatusNotFound, "not-blocked", "no processor of this process is blocked on %s partition %d at offset %d", req.Topic, *req.Partition, *req.Offset)
		return
	case err != nil:
		p.cfg.Logger.Error("status page: skip a batch", "topic", req.Topic, "partition", *req.Partition, "offset", *req.Offset, "err", err)
		fail(w, http.StatusInternalServerError, "action-failed", "the skip failed; the process's log says why")
		return
	}
	p.cfg.Logger.Warn("status page: batch skipped", "topic", req.Topic, "partition", *req.Partition, "offset", *req.Offset, "to", to, "operator", who)
	writeJSON(w, http.StatusOK, actionResult{Count: 1, Message: fmt.Sprintf(
		"skipped %s partition %d from %d to %d; the DLQ has its record (reason batch-too-large), skipped by %s", req.Topic, *req.Partition, *req.Offset, to, who)})
}

type redriveRequest struct {
	Topic   string   `json:"topic"`
	Records []string `json:"records"`
	Reason  string   `json:"reason"`
}

// redrive republishes DLQ records to their commands topic as they came,
// as `onceflow dlq redrive` does: a command handled meanwhile is
// recognized by its id.
func (p *Page) redrive(w http.ResponseWriter, r *http.Request) {
	var req redriveRequest
	if !decode(w, r, &req) {
		return
	}
	i := slices.IndexFunc(p.cfg.DLQs, func(d DLQTopicConfig) bool { return d.Topic == req.Topic })
	if i < 0 {
		fail(w, http.StatusBadRequest, "invalid-action", "not a DLQ topic of this deployment")
		return
	}
	dlq := p.cfg.DLQs[i]
	if (len(req.Records) > 0) == (req.Reason != "") {
		fail(w, http.StatusBadRequest, "invalid-action", "choose the records: their coordinates (PARTITION:OFFSET) or a reason, one of them")
		return
	}
	if len(req.Records) > maxRecordsPerRedrive {
		fail(w, http.StatusBadRequest, "invalid-action", "at most %d records at once, or a reason", maxRecordsPerRedrive)
		return
	}
	if p.cfg.Kafka == nil {
		fail(w, http.StatusConflict, "no-kafka", "this process has no Kafka client")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()

	var picked []processor.DeadLetter
	if req.Reason != "" {
		all, err := processor.ReadDLQ(ctx, p.cfg.Kafka, dlq.Topic)
		if err != nil {
			p.cfg.Logger.Error("status page: read the DLQ", "topic", dlq.Topic, "err", err)
			fail(w, http.StatusBadGateway, "dlq-unreadable", "reading %s failed; the process's log says why", dlq.Topic)
			return
		}
		for _, d := range all {
			if d.Reason == req.Reason {
				picked = append(picked, d)
			}
		}
	} else {
		for _, c := range req.Records {
			part, off, ok := coordinates(c)
			if !ok {
				fail(w, http.StatusBadRequest, "invalid-action", "%q: want PARTITION:OFFSET", c)
				return
			}
			d, found, err := readOne(ctx, p.cfg.Kafka, dlq.Topic, part, off)
			if err != nil {
				p.cfg.Logger.Error("status page: read a DLQ record", "topic", dlq.Topic, "partition", part, "offset", off, "err", err)
				fail(w, http.StatusBadGateway, "dlq-unreadable", "reading %s failed; the process's log says why", dlq.Topic)
				return
			}
			if !found {
				fail(w, http.StatusNotFound, "no-dlq-record", "no record %s in %s (nothing was redriven)", c, dlq.Topic)
				return
			}
			picked = append(picked, d)
		}
	}
	if len(picked) == 0 {
		fail(w, http.StatusNotFound, "no-dlq-record", "no record with that reason in %s", dlq.Topic)
		return
	}

	var recs []*kgo.Record
	incomplete := 0
	for _, d := range picked {
		rec, err := d.Redrive(dlq.Commands, time.Now())
		if err != nil {
			incomplete++
			continue
		}
		recs = append(recs, rec)
	}
	failed := 0
	if len(recs) > 0 {
		for _, res := range p.cfg.Kafka.ProduceSync(ctx, recs...) {
			if res.Err != nil {
				failed++
				p.cfg.Logger.Error("status page: redrive a DLQ record", "topic", dlq.Commands, "err", res.Err)
			}
		}
	}
	done := int64(len(recs) - failed)
	p.cfg.Logger.Info("status page: redrove", "topic", dlq.Topic, "records", done, "failed", failed, "incomplete", incomplete, "operator", admin.Identity(r))
	msg := fmt.Sprintf("redrove %d record(s) of %s to %s", done, dlq.Topic, dlq.Commands)
	if incomplete > 0 {
		msg += fmt.Sprintf("; %d cannot be redriven, their copy left part of the command out (`onceflow dlq list` names the source)", incomplete)
	}
	code := http.StatusOK
	if failed > 0 {
		msg += fmt.Sprintf("; %d failed, try again (a redrive twice is harmless: the command id is the same)", failed)
		code = http.StatusBadGateway
	}
	writeJSON(w, code, actionResult{Count: done, Message: msg})
}

func coordinates(s string) (int32, int64, bool) {
	ps, offs, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, false
	}
	part, err1 := strconv.ParseInt(ps, 10, 32)
	off, err2 := strconv.ParseInt(offs, 10, 64)
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		return 0, 0, false
	}
	return int32(part), off, true
}

var errStop = errors.New("stop")

// readOne reads the DLQ record at part:off.
func readOne(ctx context.Context, cl *kgo.Client, topic string, part int32, off int64) (processor.DeadLetter, bool, error) {
	var got *kgo.Record
	_, err := kafka.ReadPartitionFrom(ctx, cl, topic, part, off, true, func(r *kgo.Record) error {
		got = r
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return processor.DeadLetter{}, false, err
	}
	if got == nil || got.Offset != off {
		return processor.DeadLetter{}, false, nil
	}
	return processor.DeadLetterOf(got), true, nil
}

// decode reads an action's JSON body strictly; it answers 400 itself.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, "invalid-action", "the body is not the action's JSON object")
		return false
	}
	return true
}
