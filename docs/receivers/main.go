// A platform's receiver of deathwatch verdicts, in Go with the standard library only (the
// docs/delivery.md's example; the delivery lane builds and runs it against the controller).
//
//	DEATHWATCH_SECRET=whsec_... PORT=8080 go run main.go
//
// Each request is verified per Standard Webhooks (HMAC-SHA256 of "id.timestamp.body" with the
// secret's bytes; any of the space-separated v1 signatures may match: two during a rotation;
// the timestamp within 5 minutes), read as a CloudEvent in either HTTP mode, and handled once
// per event id: deathwatch delivers at least once, and a retry or a new leader's re-send
// carries the same id. Answer 2xx only once the event is handled.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

type verdict struct {
	Namespace string  `json:"namespace"`
	Pod       string  `json:"pod"`
	State     string  `json:"state"`
	Cause     *string `json:"cause"`
	Origin    *string `json:"origin"`
}

type event struct {
	ID       string          `json:"id"`
	Type     string          `json:"type"`
	Subject  string          `json:"subject"`
	Sequence string          `json:"sequence"`
	Data     json.RawMessage `json:"data"`
}

var (
	mu   sync.Mutex
	seen = map[string]bool{} // in production: a table whose primary key is the event id
)

func verify(secret []byte, r *http.Request, body []byte) bool {
	id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || id == "" || time.Since(time.Unix(sent, 0)).Abs() > 5*time.Minute {
		return false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(r.Header.Get("webhook-signature")) {
		version, value, ok := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(value)
		if ok && version == "v1" && err == nil && hmac.Equal(got, want) {
			return true
		}
	}
	return false
}

func main() {
	secret, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(os.Getenv("DEATHWATCH_SECRET"), "whsec_"))
	if err != nil || len(secret) == 0 {
		log.Fatal("DEATHWATCH_SECRET: expected whsec_ and base64")
	}
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil || !verify(secret, r, body) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var e event
		if r.Header.Get("ce-id") != "" { // binary mode: attributes in headers, data in the body
			e = event{ID: r.Header.Get("ce-id"), Type: r.Header.Get("ce-type"),
				Subject: r.Header.Get("ce-subject"), Sequence: r.Header.Get("ce-sequence"), Data: body}
		} else if err := json.Unmarshal(body, &e); err != nil { // structured mode
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var v verdict
		if err := json.Unmarshal(e.Data, &v); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if seen[e.ID] {
			fmt.Printf("duplicate %s\n", e.ID)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		kind := e.Type[strings.LastIndex(e.Type, ".")+1:]
		cause, origin := "", ""
		if v.Cause != nil {
			cause = *v.Cause
		}
		if v.Origin != nil {
			origin = *v.Origin
		}
		// your platform's part: reclaim, bill by origin, tell the user, replace the sandbox
		fmt.Printf("handled %s %s/%s cause=%s origin=%s\n", kind, v.Namespace, v.Pod, cause, origin)
		seen[e.ID] = true
		fmt.Printf("id %s sequence %s\n", e.ID, e.Sequence)
		w.WriteHeader(http.StatusNoContent)
	})
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:"+port, nil))
}
