package kafkacluster

import (
	"encoding/base64"
	"testing"
)

// A cluster id is what kafka-storage format takes after --cluster-id: 16
// bytes in base64url, and never a string that begins with '-', which it
// reads as an option (one id in 64 did: TestPipelineOverSASLSSL failed to
// format its node so).
func TestClusterIDsAreArguments(t *testing.T) {
	for range 10000 {
		id := newClusterID()
		if id[0] == '-' {
			t.Fatalf("cluster id %q begins with '-': kafka-storage takes it for an option", id)
		}
		if b, err := base64.RawURLEncoding.DecodeString(id); err != nil || len(b) != 16 {
			t.Fatalf("cluster id %q: %d bytes, %v; want 16 in base64url without padding", id, len(b), err)
		}
	}
}
