package ingest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pipeline/ingest"
)

// apiDoc is the part of an OpenAPI document the check reads.
type apiDoc struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas   map[string]json.RawMessage `json:"schemas"`
		Responses map[string]json.RawMessage `json:"responses"`
	} `json:"components"`
}

type apiSchema struct {
	Ref        string                `json:"$ref"`
	Type       string                `json:"type"`
	Required   []string              `json:"required"`
	Properties map[string]*apiSchema `json:"properties"`
	Pattern    string                `json:"pattern"`
	Enum       []string              `json:"enum"`
}

type apiOperation struct {
	RequestBody *struct {
		Required bool `json:"required"`
		Content  map[string]struct {
			Schema apiSchema `json:"schema"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]json.RawMessage `json:"responses"`
}

// ledgerDoc is the OpenAPI document of a server with the ledger's routes.
func ledgerDoc(t *testing.T) []byte {
	t.Helper()
	b, err := ingest.OpenAPI(ledgerRoutes(commandSerde(t)), ledgerQueries())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadDoc(t *testing.T) apiDoc {
	t.Helper()
	var d apiDoc
	if err := json.Unmarshal(ledgerDoc(t), &d); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if d.OpenAPI != "3.1.0" {
		t.Fatalf("openapi %q, want 3.1.0", d.OpenAPI)
	}
	return d
}

func (d apiDoc) op(t *testing.T, route string) apiOperation {
	t.Helper()
	method, path, _ := strings.Cut(route, " ")
	raw, ok := d.Paths[path][strings.ToLower(method)]
	if !ok {
		t.Fatalf("%s is not in the OpenAPI document", route)
	}
	var op apiOperation
	if err := json.Unmarshal(raw, &op); err != nil {
		t.Fatal(err)
	}
	return op
}

// schema resolves a $ref to components/schemas.
func (d apiDoc) schema(t *testing.T, s apiSchema) apiSchema {
	t.Helper()
	if s.Ref == "" {
		return s
	}
	name := strings.TrimPrefix(s.Ref, "#/components/schemas/")
	var out apiSchema
	if err := json.Unmarshal(d.Components.Schemas[name], &out); err != nil {
		t.Fatalf("schema %s: %v", s.Ref, err)
	}
	return out
}

// responseSchema is the JSON schema of one documented response.
func (d apiDoc) responseSchema(t *testing.T, raw json.RawMessage) apiSchema {
	t.Helper()
	var r struct {
		Ref     string `json:"$ref"`
		Content map[string]struct {
			Schema apiSchema `json:"schema"`
		} `json:"content"`
	}
	json.Unmarshal(raw, &r)
	if r.Ref != "" {
		json.Unmarshal(d.Components.Responses[strings.TrimPrefix(r.Ref, "#/components/responses/")], &r)
	}
	for _, c := range r.Content {
		return d.schema(t, c.Schema)
	}
	return apiSchema{}
}

// The document served at /openapi.json is the one ingest.OpenAPI makes
// of the routes, and it and the server agree: the same routes, every status the routes
// answer is documented, request bodies accept exactly the documented
// fields and require the documented ones, and response bodies have the
// documented fields.
func TestOpenAPIMatchesTheServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	doc := loadDoc(t)
	pool, _ := ledgerPool(t)
	s := startServer(t, pool, ingest.Config{})
	key := tenant(t, pool, "acme")

	served := s.do(t, req{method: http.MethodGet, path: "/openapi.json"})
	if served.Status != 200 || !bytes.Equal(served.Body, ledgerDoc(t)) {
		t.Fatalf("GET /openapi.json: %d, %d bytes; want the routes' document", served.Status, len(served.Body))
	}

	// Routes.
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	routes := append(slices.Clone(s.Routes()), "GET /openapi.json", "POST /v1/inbound/{provider}") // inbound: TestInboundAnswersAsDocumented
	sort.Strings(documented)
	sort.Strings(routes)
	if !slices.Equal(documented, routes) {
		t.Fatalf("routes disagree:\n document: %q\n server:   %q", documented, routes)
	}

	// Request bodies: a body with every documented field is accepted;
	// without a required one it is a 422 naming it; with an undocumented
	// one, a 422 naming that.
	n := 0
	for _, route := range s.Routes() {
		op := doc.op(t, route)
		method, path, _ := strings.Cut(route, " ")
		if method != http.MethodPost || isWebhookRoute(route) { // the webhook routes: TestWebhookRoutesMatchTheDocument
			continue
		}
		path = strings.ReplaceAll(path, "{id}", "acc-path")
		if op.RequestBody == nil {
			t.Errorf("%s: no requestBody documented", route)
			continue
		}
		sch := doc.schema(t, op.RequestBody.Content["application/json"].Schema)
		body := map[string]any{}
		for name, p := range sch.Properties {
			n++
			body[name] = sampleValue(doc.schema(t, *p), n)
		}
		send := func(b map[string]any) response {
			n++
			raw, _ := json.Marshal(b)
			return s.do(t, req{path: path, apiKey: key, idemKey: "doc-" + strconv.Itoa(n), body: string(raw)})
		}
		if r := send(body); r.Status != http.StatusAccepted {
			t.Errorf("%s with every documented field %v: got %s", route, body, r)
		}
		for _, f := range sch.Required {
			without := maps(body)
			delete(without, f)
			if r := send(without); r.Status != 422 || !slices.Contains(r.problem(t).fields(), f) {
				t.Errorf("%s without required %s: got %s, want a 422 naming it", route, f, r)
			}
		}
		for name := range body {
			if !slices.Contains(sch.Required, name) {
				without := maps(body)
				delete(without, name)
				if r := send(without); r.Status != http.StatusAccepted {
					t.Errorf("%s without optional %s: got %s", route, name, r)
				}
			}
		}
		extra := maps(body)
		extra["undocumented"] = 1
		if r := send(extra); r.Status != 422 || !slices.Contains(r.problem(t).fields(), "undocumented") {
			t.Errorf("%s with an undocumented field: got %s", route, r)
		}
		if !op.RequestBody.Required {
			n++
			if r := s.do(t, req{path: path, apiKey: key, idemKey: "doc-" + strconv.Itoa(n), noCT: true}); r.Status != http.StatusAccepted {
				t.Errorf("%s: the body is documented as optional, but an empty one got %s", route, r)
			}
		}
	}

	// Every answer of a battery of requests, success and failure, on every
	// route: its status is documented for the route, and its body has the
	// documented fields.
	limited := startServer(t, pool, ingest.Config{RateLimit: 0.001, RateBurst: 1})
	cmd := acceptedID(t, s.do(t, req{path: "/v1/accounts", apiKey: key, idemKey: "battery", body: `{"account_id":"acc-1","currency":"EUR"}`}))
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (tenant, account_id, currency, balance, version, updated_at) VALUES ('acme', 'acc-1', 'EUR', 0, 1, now())`); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		route string
		r     response
	}
	var answers []seen
	for _, route := range s.Routes() {
		if isWebhookRoute(route) {
			continue
		}
		method, path, _ := strings.Cut(route, " ")
		path = strings.ReplaceAll(path, "{id}", "acc-1")
		if strings.HasPrefix(route, "GET /v1/commands/") {
			path = "/v1/commands/" + cmd
		}
		var battery []req
		if method == http.MethodGet {
			battery = []req{
				{method: method, path: path, apiKey: key},
				{method: method, path: path},
				{method: method, path: strings.Replace(path, "acc-1", "nope", 1) + "x", apiKey: key},
				{method: method, path: path + "?wait=never", apiKey: key},
			}
		} else {
			body := validBodies[route]
			battery = []req{
				{path: path, apiKey: key, idemKey: "b-" + route, body: body},
				{path: path, apiKey: key, idemKey: "b-" + route, body: body},
				{path: path, apiKey: key, idemKey: "b-" + route, body: strings.Replace(body, "1", "2", 1) + " "},
				{path: path, idemKey: "x", body: body},
				{path: path, apiKey: key, body: body},
				{path: path, apiKey: key, idemKey: "x", body: `{"amount":-1,"zzz":0}`},
				{path: path, apiKey: key, idemKey: "x", body: body, header: map[string]string{"Content-Type": "text/plain"}},
				{path: path, apiKey: key, idemKey: "x", body: `{"a":"` + strings.Repeat("x", 1<<20) + `"}`},
			}
		}
		for _, q := range battery {
			answers = append(answers, seen{route, s.do(t, q)})
		}
		// Over the rate limit (the second request of the tenant).
		for range 2 {
			q := battery[0]
			q.idemKey = "rl-" + route
			answers = append(answers, seen{route, limited.do(t, q)})
		}
	}
	for _, a := range answers {
		op := doc.op(t, a.route)
		raw, ok := op.Responses[strconv.Itoa(a.r.Status)]
		if !ok {
			t.Errorf("%s answered %s, a status the document does not list", a.route, a.r)
			continue
		}
		sch := doc.responseSchema(t, raw)
		if a.r.Status == 200 && strings.HasSuffix(a.route, "openapi.json") {
			continue
		}
		checkBody(t, a.route, a.r, sch)
	}
	// The undocumented statuses this battery could not provoke (500, 503)
	// are covered by TestPostgresDown and TestBatchIsolatesEachRequest.
}

func isWebhookRoute(route string) bool {
	_, path, _ := strings.Cut(route, " ")
	return strings.HasPrefix(path, "/v1/webhooks")
}

// validBodies are valid requests of each command route.
var validBodies = map[string]string{
	"POST /v1/accounts":                  `{"account_id":"acc-1","currency":"EUR"}`,
	"POST /v1/accounts/{id}/deposits":    `{"amount":1}`,
	"POST /v1/accounts/{id}/withdrawals": `{"amount":1}`,
	"POST /v1/accounts/{id}/close":       `{}`,
	"POST /v1/transfers":                 `{"transfer_id":"t-1","from":"acc-1","to":"acc-2","amount":1}`,
}

// checkBody checks that a JSON body has the schema's required fields and
// no field the schema does not list.
func checkBody(t *testing.T, route string, r response, sch apiSchema) {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Errorf("%s %d: body is not a JSON object: %v", route, r.Status, err)
		return
	}
	for _, f := range sch.Required {
		if _, ok := body[f]; !ok {
			t.Errorf("%s %d: body %s lacks documented field %s", route, r.Status, r.Body, f)
		}
	}
	for f := range body {
		if _, ok := sch.Properties[f]; !ok {
			t.Errorf("%s %d: body has undocumented field %s", route, r.Status, f)
		}
	}
}

// sampleValue is a valid value for a documented property; n makes ids
// distinct.
func sampleValue(s apiSchema, n int) any {
	switch {
	case s.Type == "integer":
		return 5
	case s.Pattern == "^[A-Z]{3}$":
		return "EUR"
	}
	return fmt.Sprintf("id-%d", n)
}

func maps(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
