package api

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the OpenAPI 3 document of the routes (GET /openapi.json);
// TestOpenAPIMatchesRoutes keeps it and the router in step.
//
//go:embed openapi.json
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(OpenAPI)
	return nil
}
