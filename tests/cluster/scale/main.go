// h3i-scale is the client side of tests/cluster/scale.sh. It creates thousands of hosts
// (namespaces, TLS Secrets holding distinct certificates from one test CA, annotated
// Ingresses, Gateways and HTTPRoutes) in parallel, proves every host over HTTP/3 with real
// QUIC handshakes, times how the product reacts to changes, reads the API server's, the
// pods' and the logs' figures into one results file, and turns that file into the table.
//
// It treats h3-ingress as a black box: it writes only what a user (or cert-manager, or a
// gateway controller) writes, and reads only the listener's status.hostsSummary and
// conditions, the pods' /metrics, the API server's /metrics and the node agent's files, so
// it measures an old and a new implementation alike.
package main

import (
	"fmt"
	"os"
)

var commands = map[string]func([]string) error{
	"create":  cmdCreate,
	"served":  cmdServed,
	"latency": cmdLatency,
	"restart": cmdRestart,
	"procs":   cmdProcs,
	"apirate": cmdAPIRate,
	"watches": cmdWatches,
	"logs":    cmdLogs,
	"series":  cmdSeries,
	"sweep":   cmdSweep,
	"set":     cmdSet,
	"report":  cmdReport,
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: h3i-scale create|served|latency|restart|procs|apirate|watches|logs|series|sweep|set|report [flags] (see tests/cluster/scale.sh)")
		os.Exit(2)
	}
	if err := commands[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "h3i-scale %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
