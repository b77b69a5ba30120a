package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"golang.org/x/time/rate"
)

// prober: real QUIC handshakes (SNI = the host, ALPN h3, the certificate verified against
// the test CA and the host name, never resumed) and an HTTP/3 GET, all from one UDP socket.
type prober struct {
	tr    *quic.Transport
	h3    *http3.Transport
	roots *x509.CertPool
	port  int
}

func newProber(caFile string, port int) (*prober, error) {
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{})
	if err != nil {
		return nil, err
	}
	return &prober{tr: &quic.Transport{Conn: udp}, h3: &http3.Transport{}, roots: roots, port: port}, nil
}

// outcome of one check. Kind: ok, refused (the server answered the handshake with a TLS
// alert: it has no such host), timeout (no answer), tls (our verification failed), status
// (an HTTP status other than 200), error (anything else).
type outcome struct {
	Kind   string
	Detail string
	Leaf   string // SHA-256 of the leaf's DER
}

func (o outcome) ok() bool { return o.Kind == "ok" }

func (p *prober) check(ctx context.Context, node, host string, get bool) outcome {
	ctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	tlsConf := &tls.Config{RootCAs: p.roots, ServerName: host, NextProtos: []string{http3.NextProtoH3}}
	addr := &net.UDPAddr{IP: net.ParseIP(node), Port: p.port}
	conn, err := p.tr.Dial(ctx, addr, tlsConf, &quic.Config{HandshakeIdleTimeout: 3 * time.Second, MaxIdleTimeout: 5 * time.Second})
	if err != nil {
		return classify(err)
	}
	defer conn.CloseWithError(0, "")
	certs := conn.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return outcome{Kind: "tls", Detail: "no peer certificate"}
	}
	sum := sha256.Sum256(certs[0].Raw)
	leaf := hex.EncodeToString(sum[:])
	if !get {
		return outcome{Kind: "ok", Leaf: leaf}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+"/", nil)
	if err != nil {
		return outcome{Kind: "error", Detail: err.Error()}
	}
	resp, err := p.h3.NewClientConn(conn).RoundTrip(req)
	if err != nil {
		return outcome{Kind: "error", Detail: "request: " + err.Error(), Leaf: leaf}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return outcome{Kind: "status", Detail: fmt.Sprint(resp.StatusCode), Leaf: leaf}
	}
	return outcome{Kind: "ok", Leaf: leaf}
}

func classify(err error) outcome {
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote && te.ErrorCode.IsCryptoError() {
		return outcome{Kind: "refused", Detail: te.Error()}
	}
	var hte *quic.HandshakeTimeoutError
	var ite *quic.IdleTimeoutError
	if errors.As(err, &hte) || errors.As(err, &ite) || errors.Is(err, context.DeadlineExceeded) {
		return outcome{Kind: "timeout", Detail: err.Error()}
	}
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) || (errors.As(err, &te) && !te.Remote) {
		return outcome{Kind: "tls", Detail: err.Error()}
	}
	return outcome{Kind: "error", Detail: err.Error()}
}

type target struct{ node, host string }

const silentAfter = 64

// sweepOpts: how hard the sweep pushes. The data plane's defaults admit 500 new handshakes
// a second and 32 handshakes in progress per source; the sweep stays below both.
type sweepOpts struct {
	rate float64 // handshakes per second per node
	conc int     // handshakes in progress per node
	// retry, when set, checks a failed target once more after this pause within the same
	// sweep (reporting the first failure to onRetry), so one transient failure costs the
	// pause and not a whole second sweep of every host.
	retry   time.Duration
	onRetry func(target, outcome)
}

// register adds -rate and -conc (defaults under the data plane's own limits).
func (o *sweepOpts) register(fs *flag.FlagSet) {
	fs.Float64Var(&o.rate, "rate", 400, "handshakes per second per node")
	fs.IntVar(&o.conc, "conc", 16, "handshakes in progress per node")
}

// sweep checks every target once (handshake + GET /) and returns those that failed with
// their outcome; onOK sees each success as it happens.
func (p *prober) sweep(ctx context.Context, ts []target, o sweepOpts, onOK func(target)) map[target]outcome {
	byNode := map[string][]target{}
	for _, t := range ts {
		byNode[t.node] = append(byNode[t.node], t)
	}
	var mu sync.Mutex
	failed := map[target]outcome{}
	var wg sync.WaitGroup
	for _, list := range byNode {
		lim := rate.NewLimiter(rate.Limit(o.rate), 1)
		work := make(chan target)
		// A node whose port stays silent would cost a handshake timeout per host: after
		// silentAfter timeouts in a row its other hosts are counted failed unchecked.
		var silent atomic.Int64
		for w := 0; w < o.conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for t := range work {
					var out outcome
					if silent.Load() >= silentAfter {
						out = outcome{Kind: "skipped", Detail: fmt.Sprintf("node silent (%d handshakes in a row timed out)", silentAfter)}
					} else if lim.Wait(ctx) != nil {
						continue
					} else {
						out = p.check(ctx, t.node, t.host, true)
						if !out.ok() && out.Kind != "timeout" && o.retry > 0 {
							if o.onRetry != nil {
								o.onRetry(t, out)
							}
							time.Sleep(o.retry)
							out = p.check(ctx, t.node, t.host, true)
						}
					}
					if out.Kind == "timeout" {
						silent.Add(1)
					} else if out.Kind != "skipped" {
						silent.Store(0)
					}
					if out.ok() {
						if onOK != nil {
							onOK(t)
						}
						continue
					}
					mu.Lock()
					failed[t] = out
					mu.Unlock()
				}
			}()
		}
		go func(list []target) {
			for _, t := range list {
				work <- t
			}
			close(work)
		}(list)
	}
	wg.Wait()
	return failed
}

// until polls one host on every node (every 100 ms, handshake and, with get, a GET) until
// cond holds on all of them or the timeout passes; it returns the time the last node met it
// (counted from t0) or -1, and the last outcome seen on a node that did not.
func (p *prober) until(ctx context.Context, nodes []string, host string, get bool, t0 time.Time, timeout time.Duration, cond func(outcome) bool) (time.Duration, outcome) {
	var mu sync.Mutex
	var worst time.Duration
	var missed outcome
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func(n string) {
			defer wg.Done()
			for {
				o := p.check(ctx, n, host, get)
				if cond(o) {
					mu.Lock()
					worst = max(worst, time.Since(t0))
					mu.Unlock()
					return
				}
				if time.Since(t0) > timeout {
					mu.Lock()
					worst, missed = -1, outcome{Kind: o.Kind, Detail: n + ": " + o.Detail, Leaf: o.Leaf}
					mu.Unlock()
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}(n)
	}
	wg.Wait()
	if missed.Kind != "" {
		return -1, missed
	}
	return worst, outcome{}
}
