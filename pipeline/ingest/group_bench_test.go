package ingest

import (
	"encoding/json"
	"testing"

	"github.com/onceflow/onceflow/pipeline"
	"github.com/onceflow/onceflow/pipeline/kafka"
)

// BenchmarkAcceptJSON: the JSON texts an accepted command needs (its 202's
// body, the headers idempotency_keys keeps, the outbox row's headers),
// written out as ingest does (written) and, as the baseline, marshalled by
// encoding/json from the maps and struct ingest used before (marshalled).
// Per command, with a traceparent.
func BenchmarkAcceptJSON(b *testing.B) {
	id, tp := pipeline.NewCommandID(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	b.Run("written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, stored := acceptedResponse(id)
			_, _, _ = resp, stored, headersJSON(kafka.CommandHeaders(id, "acme", "Deposit", tp))
		}
	})
	b.Run("marshalled", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			body, _ := json.Marshal(struct {
				CommandID string `json:"command_id"`
				Status    string `json:"status"`
			}{id.String(), "pending"})
			headers := map[string]string{"Content-Type": "application/json", "Location": "/v1/commands/" + id.String()}
			stored, _ := json.Marshal(headers)
			h := map[string]string{}
			for _, x := range kafka.CommandHeaders(id, "acme", "Deposit", tp) {
				h[x.Key] = string(x.Value)
			}
			outbox, _ := json.Marshal(h)
			_, _, _ = append(body, '\n'), stored, string(outbox)
		}
	})
}
