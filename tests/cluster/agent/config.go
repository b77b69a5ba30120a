package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Config is written by scripts/cluster.sh (state dir agent/config.json).
type Config struct {
	// Server is the API server URL the agent and the pods use.
	Server string `json:"server"`
	// CAFile is the cluster CA, also put into each pod's kubeconfig.
	CAFile string `json:"caFile"`
	// StateDir holds pods/<namespace>/<pod>/ (logs, volumes, kubeconfig).
	StateDir string `json:"stateDir"`
	// Binary is the project binary run for containers of the project's image.
	Binary string `json:"binary"`
	// TagBinaries maps a tag of the project's image to the binary run for it instead of
	// Binary, so one cluster can run two builds side by side (a chart upgrade from an
	// earlier release and back); other tags, digests and untagged images run Binary.
	TagBinaries map[string]string `json:"tagBinaries,omitempty"`
	// ImageSuffix: an image whose repository (the part before ":tag" or "@digest")
	// ends with it is the project's image.
	ImageSuffix string `json:"imageSuffix"`
	// APIServerHost/Port are exported to pods as KUBERNETES_SERVICE_HOST/PORT: there is
	// no kube-proxy, so the Service ClusterIP would not answer.
	APIServerHost string     `json:"apiserverHost"`
	APIServerPort int        `json:"apiserverPort"`
	Nodes         []NodeConf `json:"nodes"`
	PodNetwork    PodNetwork `json:"podNetwork"`
	// Restart backoff of exited containers: initial, doubled per restart up to max,
	// reset after a container ran for 10 times max (kubelet: 10 s up to 300 s; shorter
	// here so crash-loop tests finish).
	BackoffInitialSeconds int `json:"backoffInitialSeconds"`
	BackoffMaxSeconds     int `json:"backoffMaxSeconds"`
	// KubeletCertFile/KeyFile: the serving certificate of the agent's kubelet API
	// (logs), valid for every node address.
	KubeletCertFile string `json:"kubeletCertFile"`
	KubeletKeyFile  string `json:"kubeletKeyFile"`
	KubeletPort     int    `json:"kubeletPort"`
}

// NodeConf is one simulated node: a network namespace with its own addresses and the
// node's client certificate (system:node:NAME in group system:nodes).
type NodeConf struct {
	Name     string `json:"name"`
	Netns    string `json:"netns"`
	IPv4     string `json:"ipv4"`
	IPv6     string `json:"ipv6"`
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
}

// PodNetwork: non-hostNetwork pods get their own network namespace with a veth on
// Bridge and addresses Prefix4+N / Prefix6+N for N in [First, Last].
type PodNetwork struct {
	Bridge     string `json:"bridge"`
	Prefix4    string `json:"prefix4"`
	PrefixLen4 int    `json:"prefixLen4"`
	Gateway4   string `json:"gateway4"`
	Prefix6    string `json:"prefix6"`
	PrefixLen6 int    `json:"prefixLen6"`
	Gateway6   string `json:"gateway6"`
	First      int    `json:"first"`
	Last       int    `json:"last"`
}

func loadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, c.validate()
}

func (c *Config) validate() error {
	switch {
	case c.Server == "":
		return fmt.Errorf("server: empty")
	case c.CAFile == "":
		return fmt.Errorf("caFile: empty")
	case c.StateDir == "":
		return fmt.Errorf("stateDir: empty")
	case c.Binary == "":
		return fmt.Errorf("binary: empty")
	case c.ImageSuffix == "":
		return fmt.Errorf("imageSuffix: empty")
	case len(c.Nodes) == 0:
		return fmt.Errorf("nodes: none")
	case c.PodNetwork.First < 1 || c.PodNetwork.Last < c.PodNetwork.First || c.PodNetwork.Last > 254:
		return fmt.Errorf("podNetwork: first/last must satisfy 1 <= first <= last <= 254")
	}
	for tag, bin := range c.TagBinaries {
		if tag == "" || strings.ContainsAny(tag, ":/@") {
			return fmt.Errorf("tagBinaries: %q is not an image tag", tag)
		}
		if !filepath.IsAbs(bin) {
			return fmt.Errorf("tagBinaries[%q]: %q is not an absolute path", tag, bin)
		}
	}
	for i, n := range c.Nodes {
		if n.Name == "" || n.Netns == "" || net.ParseIP(n.IPv4) == nil {
			return fmt.Errorf("nodes[%d]: name, netns and a valid ipv4 are required", i)
		}
		if n.IPv6 != "" && net.ParseIP(n.IPv6) == nil {
			return fmt.Errorf("nodes[%d].ipv6: %q is not an address", i, n.IPv6)
		}
	}
	if c.BackoffInitialSeconds <= 0 {
		c.BackoffInitialSeconds = 1
	}
	if c.BackoffMaxSeconds < c.BackoffInitialSeconds {
		c.BackoffMaxSeconds = 30
	}
	return nil
}

func (c *Config) backoff(restarts int32) time.Duration {
	d := time.Duration(c.BackoffInitialSeconds) * time.Second
	maxD := time.Duration(c.BackoffMaxSeconds) * time.Second
	for i := int32(0); i < restarts && d < maxD; i++ {
		d *= 2
	}
	return min(d, maxD)
}

// binaryFor is the binary run for a container of the project's image: the one TagBinaries
// names for its tag, else Binary.
func (c *Config) binaryFor(image string) string {
	if bin, ok := c.TagBinaries[imageTag(image)]; ok {
		return bin
	}
	return c.Binary
}

// imageTag is the tag of an image reference ("" when it has none or is pinned by digest).
func imageTag(image string) string {
	if strings.Contains(image, "@") {
		return ""
	}
	// A ':' after the last '/' starts the tag; one before it is a registry port.
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return ""
}

// isProjectImage reports whether image names the project's image: its repository
// (without tag or digest) is SUFFIX or ends with "/SUFFIX".
func isProjectImage(image, suffix string) bool {
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	// A ':' after the last '/' starts the tag; one before it is a registry port.
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	return repo == suffix || strings.HasSuffix(repo, "/"+suffix)
}
