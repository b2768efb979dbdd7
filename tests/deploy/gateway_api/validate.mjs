// Validates Gateway API objects (a JSON array on standard input) against the schemas of the
// Gateway API's CRDs, as @kubernetes-models/gateway-api generates them: each object's types,
// enums, patterns and limits. Prints one line per object, "ok KIND NAME" or
// "invalid KIND NAME: WHY", and exits 1 when any is invalid.
import { readFileSync } from "node:fs";
import * as v1 from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";

const objects = JSON.parse(readFileSync(0, "utf8"));
let invalid = 0;
for (const object of objects) {
  const Kind = object.apiVersion === "gateway.networking.k8s.io/v1" ? v1[object.kind] : undefined;
  const name = `${object.kind} ${object.metadata?.name}`;
  if (Kind === undefined) {
    invalid++;
    console.log(`invalid ${name}: no such kind in gateway.networking.k8s.io/v1`);
    continue;
  }
  try {
    new Kind(object).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    invalid++;
    console.log(`invalid ${name}: ${error.message}`);
  }
}
process.exit(invalid ? 1 : 0);
