package pipeline_test

import (
	"testing"

	"github.com/onceflow/onceflow/pipeline"
)

func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	root := func(status string) pipeline.CommandState {
		return pipeline.CommandState{CommandID: "debit", AggregateID: "acme/a", CommandType: "RequestTransfer", Status: status, Reason: "r-" + status}
	}
	credit := func(status string) pipeline.CommandState {
		return pipeline.CommandState{CommandID: "credit", AggregateID: "acme/b", CauseID: "debit", CauseAggregateID: "acme/a",
			CommandType: "CreditTransfer", Status: status, Reason: "unknown_account", Detail: "account does not exist"}
	}
	refund := func(status string) pipeline.CommandState {
		return pipeline.CommandState{CommandID: "refund", AggregateID: "acme/a", CauseID: "credit", CauseAggregateID: "acme/b",
			CommandType: "RefundTransfer", Status: status, Reason: "invalid_amount"}
	}
	for _, tc := range []struct {
		name     string
		root     pipeline.CommandState
		derived  []pipeline.CommandState
		status   string
		reason   string
		commandC string
	}{
		{"pending itself", root("pending"), nil, pipeline.OutcomePending, "", ""},
		{"accepted, nothing sent", root("accepted"), nil, pipeline.OutcomeCompleted, "", ""},
		{"rejected itself", root("rejected"), nil, pipeline.OutcomeRejected, "r-rejected", "debit"},
		{"failed itself", root("failed"), nil, pipeline.OutcomeFailed, "r-failed", "debit"},
		{"its credit pending", root("accepted"), []pipeline.CommandState{credit("pending")}, pipeline.OutcomePending, "", ""},
		{"credited", root("accepted"), []pipeline.CommandState{credit("accepted")}, pipeline.OutcomeCompleted, "", ""},
		{"credit refused, no refund yet", root("accepted"), []pipeline.CommandState{credit("rejected")}, pipeline.OutcomeFailed, "unknown_account", "credit"},
		{"credit refused, refund pending", root("accepted"), []pipeline.CommandState{credit("rejected"), refund("pending")}, pipeline.OutcomePending, "", ""},
		{"credit refused, refunded", root("accepted"), []pipeline.CommandState{credit("rejected"), refund("accepted")}, pipeline.OutcomeCompensated, "unknown_account", "credit"},
		{"credit refused, refund refused", root("accepted"), []pipeline.CommandState{credit("rejected"), refund("rejected")}, pipeline.OutcomeFailed, "unknown_account", "credit"},
		{"credit failed (DLQ)", root("accepted"), []pipeline.CommandState{credit("failed")}, pipeline.OutcomeFailed, "unknown_account", "credit"},
	} {
		got := pipeline.OutcomeOf(tc.root, tc.derived)
		if got.Status != tc.status || got.Reason != tc.reason || got.CommandID != tc.commandC {
			t.Errorf("%s: %+v, want %s (%q) of %q", tc.name, got, tc.status, tc.reason, tc.commandC)
		}
	}
}
