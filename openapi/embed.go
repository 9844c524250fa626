// Package openapi holds the OpenAPI 3.1 document of onceflow's HTTP API
// (docs/ingest.md), embedded so ingest serves the document of the code it was
// built from at GET /openapi.json. A test in pipeline/ingest fails when a
// route, a status it answers, or a body's fields disagree with it.
package openapi

import _ "embed"

// JSON is the OpenAPI document.
//
//go:embed openapi.json
var JSON []byte
