package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// apiserverClientCN is the only client the kubelet API accepts (kube-apiserver's
// --kubelet-client-certificate), as the kubelet's webhook authorizer would for it.
const apiserverClientCN = "kube-apiserver-kubelet-client"

// serveKubeletAPI serves the part of the kubelet API that `kubectl logs` needs, on the
// node's addresses inside its namespace: GET /containerLogs/NS/POD/CONTAINER with
// tailLines, limitBytes and follow. exec, attach and port-forward are not offered.
func (a *agent) serveKubeletAPI(ctx context.Context, n NodeConf) error {
	ca, err := os.ReadFile(a.cfg.CAFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("%s: no certificate", a.cfg.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(a.cfg.KubeletCertFile, a.cfg.KubeletKeyFile)
	if err != nil {
		return err
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/containerLogs/{ns}/{pod}/{container}", a.containerLogs)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, r.URL.Path+" is not served by h3i-node-agent (only /containerLogs)", http.StatusNotImplemented)
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != apiserverClientCN {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
	addrs := []string{n.IPv4}
	if n.IPv6 != "" {
		addrs = append(addrs, n.IPv6)
	}
	for _, ip := range addrs {
		l, err := listenInNetns(netnsPath(n.Netns), net.JoinHostPort(ip, strconv.Itoa(a.cfg.KubeletPort)))
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: handler, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(tls.NewListener(l, tc)) }()
		go func() { <-ctx.Done(); _ = srv.Close() }()
	}
	return nil
}

func (a *agent) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, pod, ctr := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	for _, s := range []string{ns, pod, ctr} {
		if s == "" || strings.ContainsAny(s, "/\\") || s == "." || s == ".." {
			http.Error(w, "bad path", http.StatusBadRequest)
			return
		}
	}
	path := filepath.Join(a.cfg.StateDir, "pods", ns, pod, ctr+".log")
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, fmt.Sprintf("no log for container %q in pod %s/%s", ctr, ns, pod), http.StatusNotFound)
		return
	}
	defer f.Close()
	q := r.URL.Query()
	data, err := io.ReadAll(f)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if t, err := strconv.Atoi(q.Get("tailLines")); err == nil && t >= 0 {
		data = tailLines(data, t)
	}
	if lb, err := strconv.Atoi(q.Get("limitBytes")); err == nil && lb >= 0 && lb < len(data) {
		data = data[:lb]
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(data)
	if q.Get("follow") != "true" {
		return
	}
	flusher, _ := w.(http.Flusher)
	br := bufio.NewReader(f)
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		if _, err := io.Copy(w, br); err != nil {
			return
		}
	}
}

func tailLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	idx := end
	for i := 0; i < n; i++ {
		j := bytes.LastIndexByte(b[:idx], '\n')
		if j < 0 {
			return b
		}
		idx = j
	}
	return b[idx+1:]
}
