package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Host is one served name and the objects that define it.
type Host struct {
	Index     int    `json:"index"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Secret    string `json:"secret"`
	Kind      string `json:"kind"` // Ingress or HTTPRoute
	Object    string `json:"object"`
	Annotated bool   `json:"annotated"`
	CertSHA   string `json:"certSha256"`
}

// State is what the commands of one run share: the hosts and when the last batch was made.
type State struct {
	Hosts       []Host `json:"hosts"`
	FirstCreate int64  `json:"firstCreateUnixMs"`
	LastCreate  int64  `json:"lastCreateUnixMs"`
	Probes      int    `json:"probes"`
}

func loadState(path string) (*State, error) {
	var st State
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &st, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &st, nil
}

func (st *State) save(path string) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return writeAtomic(path, b)
}

// annotated: the hosts that should be served.
func (st *State) annotated() []Host {
	var out []Host
	for _, h := range st.Hosts {
		if h.Annotated {
			out = append(out, h)
		}
	}
	return out
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Results holds every figure of a run as "<column>.<name>" -> value, column "base" (the
// 4-host baseline) or "scale" (HOSTS). Each command merges its figures in.
type Results map[string]any

func loadResults(path string) (Results, error) {
	r := Results{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	return r, json.Unmarshal(b, &r)
}

func mergeResults(path, col string, kv map[string]any) error {
	r, err := loadResults(path)
	if err != nil {
		return err
	}
	for k, v := range kv {
		r[col+"."+k] = v
	}
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return writeAtomic(path, b)
}

// common: the flags most commands share.
type common struct {
	kubeconfig, state, results, col string
	nodes                           string
	port, metricsPort               int
	ca, pki, nginxCerts             string
	namespace                       string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig")
	fs.StringVar(&c.state, "state", "", "the run's state file (hosts)")
	fs.StringVar(&c.results, "results", "", "the run's results file")
	fs.StringVar(&c.col, "col", "scale", "results column: base or scale")
	fs.StringVar(&c.nodes, "nodes", os.Getenv("H3I_NODE_IPS"), "node addresses (space or comma separated)")
	fs.IntVar(&c.port, "port", 443, "UDP port of the listener")
	fs.IntVar(&c.metricsPort, "metrics-port", 9476, "TCP port of the data plane's /metrics")
	fs.StringVar(&c.ca, "ca", "", "the test CA's certificate (PEM)")
	fs.StringVar(&c.pki, "pki", "", "directory with the test CA's ca.crt and ca.key")
	fs.StringVar(&c.nginxCerts, "nginx-certs", "", "directory nginx reads HOST.crt and HOST.key from")
	fs.StringVar(&c.namespace, "namespace", "h3-ingress", "namespace of the operator and data plane")
}

// open reads the run's state and, when asked, makes an API client and a prober (QUIC
// handshakes verified against the test CA): what most commands start with.
func (c *common) open(withKube, withProber bool) (st *State, k *kube, p *prober, err error) {
	if st, err = loadState(c.state); err != nil {
		return nil, nil, nil, err
	}
	if withKube {
		if k, err = newKube(c.kubeconfig); err != nil {
			return nil, nil, nil, err
		}
	}
	if withProber {
		if p, err = newProber(c.ca, c.port); err != nil {
			return nil, nil, nil, err
		}
	}
	return st, k, p, nil
}

func (c *common) nodeList() []string {
	return strings.FieldsFunc(c.nodes, func(r rune) bool { return r == ' ' || r == ',' })
}

// secs: seconds with millisecond precision, for the results file.
func secs(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func cmdSet(args []string) error {
	fs := flag.NewFlagSet("set", flag.ExitOnError)
	var c common
	c.register(fs)
	_ = fs.Parse(args)
	kv := map[string]any{}
	for _, a := range fs.Args() {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want KEY=VALUE", a)
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			kv[k] = f
		} else {
			kv[k] = v
		}
	}
	return mergeResults(c.results, c.col, kv)
}

func jsonBytes(v any) ([]byte, error) { return json.Marshal(v) }
