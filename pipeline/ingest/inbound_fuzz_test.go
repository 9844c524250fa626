package ingest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pipeline"
)

// FuzzInboundDelivery feeds arbitrary signature headers and bodies to both
// schemes' verification and to the reading of a verified delivery's event:
// nothing panics; a delivery is accepted only with a signature that is the
// HMAC of its content under the secret (the fuzzer cannot forge one, so
// only the seeds signed for real pass); and an event read out of a body
// names a valid aggregate and a command its route validated.
func FuzzInboundDelivery(f *testing.F) {
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fuzz-secret-0123456789abcdef0123"))
	body := `{"id":"evt_1","type":"payment.succeeded","data":{"account_id":"acc-1","amount":5,"seq":3}}`
	now := time.Unix(1_800_000_000, 0)
	h, _ := SignStandardWebhooks(secret, "msg_1", now, []byte(body))
	st := SignStripe(secret, now, []byte(body))
	f.Add("msg_1", h.Get("webhook-timestamp"), h.Get("webhook-signature"), st.Get("Stripe-Signature"), body)
	f.Add("", "", "v1,", "t=,v1=zz", `{"type":5}`)
	f.Add("x", "-1", "v1,AAAA v2,BBBB", "t=1800000000,v1=00,v0=11", `{"data":{"account_id":["a"],"amount":1e400}}`)
	f.Add("x", "99999999999999999999", "v1 ,", ",,=,t", `[{"type":"payment.succeeded"}]`)

	routes := map[string]*Route{}
	for _, r := range fuzzRoutes {
		routes[r.Command.MessageType()] = r
	}
	s := &Server{cfg: Config{MaxStringBytes: pipeline.DefaultMaxStringBytes, Shards: 16}}
	events := map[string]ProviderEvent{
		"payment.succeeded": {Command: "Deposit", Fields: map[string]string{"amount": "/data/amount"}, Precedence: 2},
		"account.opened":    {Command: "OpenAccount", Fields: map[string]string{"currency": "/data/currency"}},
		"noted":             {},
	}
	providers, err := s.prepareProviders([]Provider{
		{Name: "std", Scheme: SchemeStandardWebhooks, Secrets: []string{secret}, Tenant: "acme", AggregateID: "/data/account_id", Events: events},
		{Name: "stripe", Scheme: SchemeStripe, Secrets: []string{secret}, Tenant: "acme", AggregateID: "/data/account_id", Version: "/data/seq", Events: events},
	}, routes)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig, stripeSig, body string) {
		hdr := http.Header{}
		hdr.Set("webhook-id", id)
		hdr.Set("webhook-timestamp", ts)
		hdr.Set("webhook-signature", sig)
		hdr.Set("Stripe-Signature", stripeSig)
		for _, p := range providers {
			err := p.verifier.verify(hdr, []byte(body), now)
			if err == nil && !signedFor(p.Scheme, secret, hdr, body) {
				t.Fatalf("%s accepted a signature that is not the content's HMAC: %q", p.Scheme, hdr)
			}
			r := httptest.NewRequest(http.MethodPost, "/v1/inbound/"+p.Name, strings.NewReader(body))
			r.Header = hdr
			row, prob := s.inboundEvent(r, p, []byte(body))
			if prob != nil {
				if prob.Status != http.StatusUnprocessableEntity {
					t.Fatalf("a delivery's body answered %d, want 422", prob.Status)
				}
				continue
			}
			if row.eventID == "" || len(row.eventID) > 255 || row.eventType == "" {
				t.Fatalf("read event id %q and type %q", row.eventID, row.eventType)
			}
			if row.aggregateID != nil {
				if _, local, err := pipeline.SplitAggregateID(*row.aggregateID); err != nil || pipeline.ValidateLocalID(local) != nil {
					t.Fatalf("aggregate %q", *row.aggregateID)
				}
			}
			if row.commandType != nil && row.commandID != InboundCommandID(p.Name, row.eventID) {
				t.Fatalf("command id %s is not derived from the event", row.commandID)
			}
		}
	})
}

// signedFor recomputes whether hdr carries the content's HMAC under
// secret: the property verify must not break.
func signedFor(scheme, secret string, hdr http.Header, body string) bool {
	if scheme == SchemeStandardWebhooks {
		k, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		want := hmacSHA256(k, hdr.Get("webhook-id")+"."+hdr.Get("webhook-timestamp")+"."+body)
		for _, s := range strings.Fields(hdr.Get("webhook-signature")) {
			if v, b64, ok := strings.Cut(s, ","); ok && v == "v1" {
				if got, err := base64.StdEncoding.DecodeString(b64); err == nil && hmac.Equal(got, want) {
					return true
				}
			}
		}
		return false
	}
	var ts string
	for _, part := range strings.Split(hdr.Get("Stripe-Signature"), ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(part), "="); k == "t" {
			ts = v
		}
	}
	want := hmacSHA256([]byte(secret), ts+"."+body)
	for _, part := range strings.Split(hdr.Get("Stripe-Signature"), ",") {
		if k, v, _ := strings.Cut(strings.TrimSpace(part), "="); k == "v1" {
			if got, err := hex.DecodeString(v); err == nil && hmac.Equal(got, want) {
				return true
			}
		}
	}
	return false
}

// hmacSHA256 is the oracle's own HMAC, apart from the code it checks.
func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
