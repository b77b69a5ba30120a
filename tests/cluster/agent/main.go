// Command h3i-node-agent stands in for the kubelet of the test cluster that
// scripts/cluster.sh starts: it registers the cluster's nodes, keeps their Leases
// and Ready conditions fresh, and runs the pods bound to them as local processes
// (no container isolation, no image pulls; see tests/cluster/README.md).
//
//	h3i-node-agent run CONFIG.json     the agent itself
//	h3i-node-agent launch [flags] -- ARGV...
//	                                   internal: enter a pod's mount and network
//	                                   namespaces, then exec ARGV (used by run)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "run":
		if len(os.Args) != 3 {
			usage()
		}
		cfg, err := loadConfig(os.Args[2])
		if err != nil {
			fatalf("config: %v", err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := run(ctx, cfg); err != nil {
			fatalf("%v", err)
		}
	case "launch":
		if err := launchMain(os.Args[2:]); err != nil {
			// The container's log file is our stderr: the reason lands where tests look.
			fatalf("launch: %v", err)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: h3i-node-agent run CONFIG.json | launch [--netns PATH] [--mount SRC:DST[:ro]]... [--workdir DIR] -- ARGV...")
	os.Exit(2)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "h3i-node-agent: "+format+"\n", args...)
	os.Exit(1)
}
