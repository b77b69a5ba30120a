// Command etcd is etcd's own server command (etcdmain) built from the published
// go.etcd.io/etcd/server/v3 module, at the version k8s.io/kubernetes v1.37.2 requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
