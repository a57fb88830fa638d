// A private registry for the lanes (hack/localcluster/registry.py): go-containerregistry's
// registry, in memory, behind HTTP basic auth as a private registry is, so that a pull
// without the right credentials is refused (401) and one with them succeeds. Plain HTTP on a
// loopback address, which containerd pulls from without TLS (its rule for localhost).
//
//	registry ADDRESS USER:PASSWORD
//
// It prints "listening on HOST:PORT" once it accepts connections, and logs every refusal.
package main

import (
	"crypto/subtle"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	if len(os.Args) != 3 || !strings.Contains(os.Args[2], ":") {
		fmt.Fprintln(os.Stderr, "usage: registry ADDRESS USER:PASSWORD")
		os.Exit(2)
	}
	user, password, _ := strings.Cut(os.Args[2], ":")
	inner := registry.New(registry.Logger(log.New(os.Stderr, "", log.LstdFlags)))
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			log.Printf("refused %s %s (credentials given: %t)", r.Method, r.URL.Path, ok)
			w.Header().Set("WWW-Authenticate", `Basic realm="deathwatch-lane"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`,
				http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	})
	listener, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		log.Fatalf("listen %s: %v", os.Args[1], err)
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	log.Fatal(http.Serve(listener, guarded))
}
