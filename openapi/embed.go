// Package openapi holds the parts of the OpenAPI 3.1 document of onceflow's
// HTTP API that every deployment shares (docs/ingest.md): the info, the
// security scheme, the problem responses, GET /v1/commands/{id} and GET
// /openapi.json. Ingest adds each domain's routes to it
// (ingest.OpenAPI) and serves the whole at GET /openapi.json.
package openapi

import _ "embed"

// Base is the shared part of the document.
//
//go:embed base.json
var Base []byte
