"""The Grafana dashboard, defined once in Python and written as JSON by gen.py.

Written as code so panel ids, grid positions and the shared label filters cannot drift; the JSON
in charts/h3-ingress/dashboards/ and deploy/grafana/ is what users import.
"""

from __future__ import annotations

from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every h3_ingress_* selector carries these; `listener` comes from the chart's PodMonitor, and
# `.*` (the All value) also matches series without the label (plain Prometheus).
SEL = 'listener=~"$listener"'
HSEL = 'listener=~"$listener", host=~"$host"'
RATE = "$__rate_interval"


def _target(ref: str, expr: str, legend: str) -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}


def _panel(title, description, targets, unit, *, kind="timeseries", min_=None, max_=None, stack=False):
    defaults: dict[str, Any] = {"unit": unit}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        }
        options = {
            "legend": {"showLegend": True, "displayMode": "table", "placement": "bottom",
                       "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:  # stat
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        }
    refs = "ABCDEFGH"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [_target(refs[i], e, l) for i, (e, l) in enumerate(targets)],
    }


def _rows() -> list[tuple[str, list[tuple[int, dict[str, Any]]]]]:
    """(row title, [(width, panel)])."""
    adoption = [
        (6, _panel(
            "HTTP/3 share of all requests",
            "HTTP/3 requests / all requests the TCP ingress served for the selected hosts (it "
            "serves the requests we proxy too, so this is the share of traffic that came over h3).",
            [(f'sum(h3_ingress:h3_requests:rate5m{{host=~"$host"}}) / sum(h3_ingress:tcp_ingress_requests:rate5m{{host=~"$host"}})', "share")],
            "percentunit", kind="stat", min_=0, max_=1)),
        (18, _panel(
            "HTTP/3 share of requests per host",
            "Recording rule h3_ingress:h3_request_share:ratio_rate5m. host=\"*\" is the all-hosts "
            "share when the TCP ingress has no per-host counter.",
            [('h3_ingress:h3_request_share:ratio_rate5m{host=~"$host"}', "{{host}}")],
            "percentunit", min_=0, max_=1)),
        (12, _panel(
            "HTTP/3 requests/s by status class",
            "Requests answered over HTTP/3, by the status class the client got.",
            [(f"sum by (status_class) (rate(h3_ingress_requests_total{{{HSEL}}}[{RATE}]))", "{{status_class}}")],
            "reqps", min_=0, stack=True)),
        (12, _panel(
            "HTTP/3 request latency",
            "From request headers to the end of the response body, through the TCP ingress, over "
            "all hosts of the listener (the histogram has no host label: 16 series per host would "
            "dominate a scrape).",
            [(f"histogram_quantile(0.5, sum by (le) (rate(h3_ingress_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "p50"),
             (f"histogram_quantile(0.95, sum by (le) (rate(h3_ingress_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))", "p95")],
            "s", min_=0)),
        (12, _panel(
            "Errors reaching the TCP ingress",
            "Requests we answered ourselves because the TCP ingress could not be used, by kind; "
            "and requests rejected before reaching it, by reason.",
            [(f"sum by (kind) (rate(h3_ingress_upstream_errors_total{{{SEL}}}[{RATE}]))", "upstream {{kind}}"),
             (f"sum by (reason) (rate(h3_ingress_rejected_requests_total{{{SEL}}}[{RATE}]))", "rejected {{reason}}")],
            "reqps", min_=0)),
        (12, _panel(
            "Alt-Svc advertised by the TCP ingress",
            "Hosts whose last probe found the TCP ingress answering with Alt-Svc h3 for our port "
            "(advertised) or not (missing). Without it browsers never switch to HTTP/3. Which "
            "hosts: the H3IngressAltSvcMissing alert, or the data plane's /hosts.",
            [(f"max by (result) (h3_ingress_alt_svc_hosts{{{SEL}}})", "{{result}}")],
            "short", min_=0)),
        (24, _panel(
            "Requests held on connections to the TCP ingress",
            "Requests from sending to the TCP ingress to the end of their response. Each upstream "
            "connection carries at most upstream.maxStreamsPerConnection of them; lanes opened "
            "counts the extra connections that took (docs/reliability.md, Upstream connections).",
            [(f"sum(h3_ingress_upstream_requests{{{SEL}}})", "requests held"),
             (f"sum(increase(h3_ingress_upstream_lanes_opened_total{{{SEL}}}[{RATE}]))", "lanes opened")],
            "short", min_=0)),
    ]
    udp = [
        (12, _panel(
            "UDP datagrams dropped",
            "Our sockets: datagrams the kernel dropped on the h3-ingress socket (/proc/net/udp). "
            "Host: node-wide RcvbufErrors (/proc/net/snmp, snmp6), which also counts other UDP sockets.",
            [(f"sum by (family) (rate(h3_ingress_udp_socket_drops_total{{{SEL}}}[{RATE}]))", "our socket {{family}}"),
             (f"max by (family) (rate(h3_ingress_udp_host_receive_buffer_errors_total{{{SEL}}}[{RATE}]))", "host rcvbuf errors {{family}}")],
            "pps", min_=0)),
        (12, _panel(
            "Socket buffers: read back vs requested",
            "SO_RCVBUF/SO_SNDBUF as read back from the kernel, which reports twice what it "
            "grants, next to twice the request: the lines coincide unless net.core.rmem_max/"
            "wmem_max clamped the buffer.",
            [(f"min by (family) (h3_ingress_udp_socket_receive_buffer_bytes{{{SEL}}})", "rcvbuf read back {{family}}"),
             (f"2 * max by (family) (h3_ingress_udp_socket_receive_buffer_requested_bytes{{{SEL}}})", "2 x rcvbuf requested {{family}}"),
             (f"min by (family) (h3_ingress_udp_socket_send_buffer_bytes{{{SEL}}})", "sndbuf read back {{family}}"),
             (f"2 * max by (family) (h3_ingress_udp_socket_send_buffer_requested_bytes{{{SEL}}})", "2 x sndbuf requested {{family}}")],
            "bytes", min_=0)),
        (12, _panel(
            "Active QUIC connections",
            "Open connections by client address family.",
            [(f"sum by (family) (h3_ingress_active_connections{{{SEL}}})", "{{family}}")],
            "short", min_=0, stack=True)),
        (12, _panel(
            "QUIC handshakes by result",
            "ok, unknown_sni (no certificate for the name), failed, timeout.",
            [(f"sum by (result) (rate(h3_ingress_handshakes_total{{{SEL}}}[{RATE}]))", "{{result}}")],
            "ops", min_=0, stack=True)),
    ]
    transport = [
        (12, _panel(
            "Round-trip time",
            "Smoothed RTT of connections, observed when they close.",
            [(f"histogram_quantile(0.5, sum by (le) (rate(h3_ingress_connection_rtt_seconds_bucket{{{SEL}}}[{RATE}])))", "p50"),
             (f"histogram_quantile(0.95, sum by (le) (rate(h3_ingress_connection_rtt_seconds_bucket{{{SEL}}}[{RATE}])))", "p95")],
            "s", min_=0)),
        (12, _panel(
            "Lost packets",
            "Packets QUIC declared lost per second, and as a share of packets sent (summed over "
            "closed connections).",
            [(f"sum(rate(h3_ingress_connection_lost_packets_total{{{SEL}}}[{RATE}]))", "lost/s"),
             (f"sum(rate(h3_ingress_connection_lost_packets_total{{{SEL}}}[{RATE}])) / sum(rate(h3_ingress_connection_sent_packets_total{{{SEL}}}[{RATE}]))", "lost / sent")],
            "short", min_=0)),
        (12, _panel(
            "Discovered path MTU",
            "UDP payload size path-MTU discovery (DPLPMTUD, no ICMP needed) settled on, and MTU "
            "black holes it detected.",
            [(f"histogram_quantile(0.05, sum by (le) (rate(h3_ingress_connection_path_mtu_bytes_bucket{{{SEL}}}[{RATE}])))", "p5"),
             (f"histogram_quantile(0.5, sum by (le) (rate(h3_ingress_connection_path_mtu_bytes_bucket{{{SEL}}}[{RATE}])))", "p50"),
             (f"sum(increase(h3_ingress_connection_mtu_black_holes_total{{{SEL}}}[{RATE}]))", "black holes")],
            "bytes", min_=0)),
        (12, _panel(
            "Congestion events, forgiven and tolerated losses",
            "Window reductions; losses of the handshake flight that cubic-hs did not treat as "
            "congestion (such a loss says nothing about the path's capacity, and reducing for "
            "it would keep the window small for the whole connection); losses "
            "cubic-hs-lt read as random (no queueing delay, at most 5 % loss).",
            [(f"sum(rate(h3_ingress_connection_congestion_events_total{{{SEL}}}[{RATE}]))", "congestion events/s"),
             (f"sum(rate(h3_ingress_congestion_handshake_losses_forgiven_total{{{SEL}}}[{RATE}]))", "handshake losses forgiven/s"),
             (f"sum(rate(h3_ingress_congestion_random_losses_tolerated_total{{{SEL}}}[{RATE}]))", "random losses tolerated/s")],
            "short", min_=0)),
        (12, _panel(
            "Certificate expiry",
            "Time left on the certificate that expires first, and on the ten that expire first "
            "among the selected hosts with traffic or a probe (per-host series exist only for "
            "those, and not at all with metrics.hostLabel: false).",
            [(f"min(h3_ingress_certificate_earliest_expiry_timestamp_seconds{{{SEL}}}) - time()", "earliest"),
             (f"bottomk(10, min by (host) (h3_ingress_certificate_expiry_timestamp_seconds{{{HSEL}}}) - time())", "{{host}}")],
            "s")),
        (12, _panel(
            "Hosts and configuration reloads",
            "Hosts with a loaded certificate, and configuration updates by result.",
            [(f"max(h3_ingress_hosts{{{SEL}}})", "hosts"),
             (f"sum by (result) (increase(h3_ingress_config_reloads_total{{{SEL}}}[{RATE}]))", "reloads {{result}}")],
            "short", min_=0)),
    ]
    return [("Adoption and errors", adoption), ("UDP and sockets", udp), ("QUIC transport", transport)]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-query"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for title, row in _rows():
        panels.append({"type": "row", "id": next_id, "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x = 0
        height = 8
        for width, panel in row:
            if x + width > 24:
                x = 0
                y += height
            panel = dict(panel, id=next_id, gridPos={"h": height, "w": width, "x": x, "y": y})
            panels.append(panel)
            next_id += 1
            x += width
        y += height
    return {
        "title": "h3-ingress",
        "uid": "h3-ingress",
        "description": "HTTP/3 in front of the TCP ingress: adoption per host, errors, UDP drops, "
                       "socket buffers, QUIC transport.",
        "tags": ["h3-ingress", "http3", "quic"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "links": [],
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
             "regex": ""},
            _variable("listener", "Listener", "label_values(h3_ingress_build_info, listener)"),
            _variable("host", "Host", 'label_values(h3_ingress_requests_total{listener=~"$listener"}, host)'),
        ]},
        "panels": panels,
    }
