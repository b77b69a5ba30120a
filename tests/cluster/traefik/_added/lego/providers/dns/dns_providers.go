// Package dns stands in for lego's generated DNS-01 provider registry
// (github.com/go-acme/lego/v5/providers/dns, zz_gen_dns_providers.go) in the Traefik
// build of tests/cluster/traefik. The generated file imports every DNS provider of lego,
// and 13 of their SDK modules are not served by the module registry this project builds
// from, so Traefik cannot be compiled with it. scripts/addons-build.sh copies lego's
// module and puts this file in place of that one: Traefik's ACME provider then builds,
// and an ACME DNS challenge fails with the error below. The test cluster issues no ACME
// certificates (its TLS Secrets come from the tests' own CA).
package dns

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

// NewDNSChallengeProviderByName refuses every provider name.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS challenge provider %q: no DNS provider is built into this Traefik (tests/cluster/traefik)", name)
}
