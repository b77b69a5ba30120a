// RequireAuthStale for the Traefik build of tests/cluster/traefik. Traefik's digest
// authentication calls it on the DigestAuth of its fork of go-http-auth
// (github.com/containous/go-http-auth), which the module registry this project builds
// from does not serve; scripts/addons-build.sh builds Traefik against a copy of the
// upstream module (github.com/abbot/go-http-auth, served) with this file added. Upstream's
// CheckAuth never reports a stale nonce, so Traefik does not reach this method with it;
// it answers as RequireAuth does, with the challenge marked stale (RFC 7616 3.3).
package auth

import "net/http"

// RequireAuthStale sends RequireAuth's challenge with stale=true.
func (da *DigestAuth) RequireAuthStale(w http.ResponseWriter, r *http.Request) {
	da.RequireAuth(staleChallenge{ResponseWriter: w, header: da.Headers.V().Authenticate}, r)
}

// staleChallenge appends stale=true to the challenge header before the status goes out.
type staleChallenge struct {
	http.ResponseWriter
	header string
}

func (s staleChallenge) WriteHeader(code int) {
	h := s.Header()
	if v := h.Get(s.header); v != "" {
		h.Set(s.header, v+", stale=true")
	}
	s.ResponseWriter.WriteHeader(code)
}
