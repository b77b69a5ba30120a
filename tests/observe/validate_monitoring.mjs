// Validates Prometheus Operator objects (JSON array on stdin) with the JSON-schema validators
// that @kubernetes-models/prometheus-operator generates from the operator's Go API types.
// Types, enums and required fields are checked; unknown fields are not (the schemas allow them).
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PodMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const models = { ServiceMonitor, PodMonitor, PrometheusRule };
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const objects = JSON.parse(Buffer.concat(chunks).toString());
let failed = 0;
for (const obj of objects) {
  const name = `${obj.kind}/${obj.metadata?.name}`;
  const Model = models[obj.kind];
  if (!Model || obj.apiVersion !== "monitoring.coreos.com/v1") {
    console.log(`FAIL ${name}: no schema for ${obj.apiVersion} ${obj.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`ok   ${name} (prometheus-operator schema)`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
