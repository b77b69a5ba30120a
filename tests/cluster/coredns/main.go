// CoreDNS for the test cluster's real nodes, with the plugins a Kubernetes cluster's DNS
// Corefile uses (kubeadm's: errors, health, ready, kubernetes, prometheus, forward, cache,
// loop, reload, loadbalance) plus log, built as CoreDNS documents for a custom plugin
// set: this main imports those plugins and runs coremain. CoreDNS's own main
// (github.com/coredns/coredns, core/plugin) imports every plugin, including the cloud
// DNS backends with their SDKs, about 600 more packages to compile cold
// (scripts/addons-build.sh).
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
