package httpjson

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, http.StatusConflict, map[string]string{"code": "busy"})
	if rec.Code != http.StatusConflict {
		t.Fatalf("status %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	var got map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got["code"] != "busy" {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if want := "{\n  \"code\": \"busy\"\n}\n"; rec.Body.String() != want {
		t.Fatalf("body %q, want %q (indented)", rec.Body.String(), want)
	}
}
