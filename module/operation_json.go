package module

import (
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// writeJSON writes v with status; the one encoder for the operations API.
func writeJSON(w http.ResponseWriter, status int, v any) { apierr.WriteJSON(w, status, v) }
