// Package httpjson writes the JSON replies of vmsan's HTTP APIs (the
// daemon's control API and the replication plugin's routes on it), so
// every reply has the same content type and indentation.
//
// Simplest use:
//
//	httpjson.Write(w, http.StatusOK, v)
//
// It imports nothing from the project (a leaf).
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write sends v as an indented JSON body with the given status. An encoding
// error is not reported: the status line is already sent, and every value
// the APIs send is a plain struct, map or slice that always encodes.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
